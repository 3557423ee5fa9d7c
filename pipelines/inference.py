"""Feature extractors inside Beam: ``RunInference`` ModelHandlers over a ``features`` extractor
(over tensors, or over image-store content ids: what the build uses). Why here: ``features/``
never imports Beam."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, PredictionResult

from features.base import Extractor, int_option, resolve_device
from features.cpu_heap import HEAP_TRIM_SLACK, tune_cpu_heap
from features.images import decode
from pipelines.image_store import ImageStore
from pipelines.worker_tuning import tune_worker_process


class ExtractorModelHandler(ModelHandler[torch.Tensor, PredictionResult, torch.nn.Module]):
    """Loads ``extractor``'s model once per worker and runs its batch-independent forward.

    Batches are fixed at ``batch_size`` (min = max) so BatchElements does not shrink them by
    timing; the batch size only changes how many chunks one call runs, never the outputs.
    """

    def __init__(
        self,
        extractor,
        device: str,
        batch_size: int,
        cpu_threads: int | None = None,
        trim_slack: int | None = HEAP_TRIM_SLACK,
    ):
        super().__init__(min_batch_size=batch_size, max_batch_size=batch_size)
        self._cpu_threads, self._trim_slack = cpu_threads, trim_slack
        self._extractor = extractor
        self._device = device
        self._model_id = f"{extractor.name}@{extractor.version}"
        self._trim = None

    def load_model(self) -> torch.nn.Module:
        if self._device == "cpu":
            # once per worker process: freed buffers stay in the heap, given back now and then
            self._trim = tune_cpu_heap(self._trim_slack)
            if self._cpu_threads:
                torch.set_num_threads(self._cpu_threads)
        return self._extractor.load_model(self._device)

    def run_inference(
        self,
        batch: Sequence[torch.Tensor],
        model: torch.nn.Module,
        inference_args: dict[str, Any] | None = None,
    ) -> list[PredictionResult]:
        outs = self._extractor.forward(model, batch, self._device)
        self.trim_heap()
        return [PredictionResult(x, out, self._model_id) for x, out in zip(batch, outs, strict=True)]

    def trim_heap(self) -> None:
        """After each batch on the CPU: :class:`~features.cpu_heap.HeapTrim`."""
        if self._trim is not None:
            self._trim()

    def get_num_bytes(self, batch: Sequence[torch.Tensor]) -> int:
        # the default pickles the whole batch just to measure it
        return sum(x.element_size() * x.nelement() for x in batch)

    def get_metrics_namespace(self) -> str:
        return "mmlinks.features"


class StoredImageModelHandler(ExtractorModelHandler):
    """Content ids of the image store -> PredictionResult(example=(content id, (width, height))).

    Each batch reads, decodes and preprocesses its own images right before the forward, so what
    travels into RunInference is a list of ids, not pixel tensors (~200 KB an image at 224 px).
    Why: a distributed runner places a task where its inputs are; with tensors as inputs the
    feature stage stayed on the workers that had loaded the pixels (three of four partitions on
    one Dask worker, the other idle: docs/benchmarks.md, issue #35), with ids any worker can take
    any batch. Flink and Dataflow fuse LoadPixels into the same stage anyway; the DirectRunner
    does the same work in the same process. The original size rides in the example: region
    extractors report boxes in original pixels."""

    def __init__(
        self,
        extractor,
        store_root: str,
        device: str,
        batch_size: int,
        cpu_threads: int | None = None,
        trim_slack: int | None = HEAP_TRIM_SLACK,
    ):
        super().__init__(extractor, device, batch_size, cpu_threads, trim_slack)
        self._store_root = store_root
        self._store = None

    def load_model(self) -> torch.nn.Module:
        tune_worker_process()
        self._store = ImageStore(self._store_root)
        return super().load_model()

    def run_inference(
        self,
        batch: Sequence[str],
        model: torch.nn.Module,
        inference_args: dict[str, Any] | None = None,
    ) -> list[PredictionResult]:
        images = [decode(self._store.get_bytes(content_id)) for content_id in batch]
        sizes = [img.size for img in images]
        tensors = [self._extractor.preprocess(img) for img in images]
        del images  # decoded pixels go before the forward's activations are allocated
        outs = self._extractor.forward(model, tensors, self._device)
        del tensors  # and the inputs before the heap is trimmed
        self.trim_heap()
        return [
            PredictionResult((content_id, size), out, self._model_id)
            for content_id, size, out in zip(batch, sizes, outs, strict=True)
        ]

    def get_num_bytes(self, batch: Sequence[str]) -> int:
        return sum(len(content_id) for content_id in batch)


def _batch_size(extractor: Extractor, device: str, batch_size: int) -> int:
    """``batch_size`` rounded up to a multiple of the forward chunk (no padded forward but a
    bundle's last)."""
    batch_size = int_option("batch_size", batch_size)
    chunk = extractor.chunk_for(device)
    return -(-batch_size // chunk) * chunk if chunk else batch_size


def stored_image_handler(
    extractor: Extractor,
    store_root: str,
    device: str = "cpu",
    batch_size: int = 32,
    cpu_threads: int | None = None,
    trim_slack: int | None = HEAP_TRIM_SLACK,
) -> StoredImageModelHandler:
    """A Beam ModelHandler over content ids of the image store at ``store_root`` ->
    PredictionResult(example=(content id, (width, height)), inference=raw output); batching,
    model sharing and threads as :func:`model_handler`. ``trim_slack``: a CPU worker gives its
    heap's free pages back after that much growth (``features.cpu_heap.tune_cpu_heap``; None never,
    0 after every batch)."""
    device = resolve_device(device)
    return StoredImageModelHandler(
        extractor, store_root, device, _batch_size(extractor, device, batch_size), cpu_threads, trim_slack
    )


def model_handler(
    extractor: Extractor, device: str = "cpu", batch_size: int = 32, cpu_threads: int | None = None
) -> KeyedModelHandler:
    """A Beam ``KeyedModelHandler`` over ``(key, tensor)`` elements -> ``(key, PredictionResult)``.

    The model is loaded once per worker; Beam batches are exactly ``batch_size`` elements
    (except at a bundle's end), rounded up to a multiple of the forward chunk so no forward
    is padded except the very last one of a bundle. ``cpu_threads`` sets torch's intra-op
    threads in each worker (several worker processes on one machine should share its cores)."""
    device = resolve_device(device)
    return KeyedModelHandler(
        ExtractorModelHandler(extractor, device, _batch_size(extractor, device, batch_size), cpu_threads)
    )
