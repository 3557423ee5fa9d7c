"""Feature extractors inside Beam: the ``RunInference`` ModelHandler over a ``features`` extractor.

``features/`` never imports Beam; this module adapts its :class:`~features.base.Extractor`
contract (``load_model`` / ``forward``) to Beam's ``ModelHandler``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, PredictionResult

from features.base import Extractor, int_option, resolve_device, tune_cpu_malloc


class ExtractorModelHandler(ModelHandler[torch.Tensor, PredictionResult, torch.nn.Module]):
    """Loads ``extractor``'s model once per worker and runs its batch-independent forward.

    Batches are fixed at ``batch_size`` (min = max) so BatchElements does not shrink them by
    timing; the batch size only changes how many chunks one call runs, never the outputs.
    """

    def __init__(self, extractor, device: str, batch_size: int, cpu_threads: int | None = None):
        super().__init__(min_batch_size=batch_size, max_batch_size=batch_size)
        self._cpu_threads = cpu_threads
        self._extractor = extractor
        self._device = device
        self._model_id = f"{extractor.name}@{extractor.version}"

    def load_model(self) -> torch.nn.Module:
        if self._device == "cpu":
            tune_cpu_malloc()  # once per worker process; see its docstring
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
        return [PredictionResult(x, out, self._model_id) for x, out in zip(batch, outs, strict=True)]

    def get_num_bytes(self, batch: Sequence[torch.Tensor]) -> int:
        # the default pickles the whole batch just to measure it
        return sum(x.element_size() * x.nelement() for x in batch)

    def get_metrics_namespace(self) -> str:
        return "mmlinks.features"


def model_handler(
    extractor: Extractor, device: str = "cpu", batch_size: int = 32, cpu_threads: int | None = None
) -> KeyedModelHandler:
    """A Beam ``KeyedModelHandler`` over ``(key, tensor)`` elements -> ``(key, PredictionResult)``.

    The model is loaded once per worker; Beam batches are exactly ``batch_size`` elements
    (except at a bundle's end), rounded up to a multiple of the forward chunk so no forward
    is padded except the very last one of a bundle. ``cpu_threads`` sets torch's intra-op
    threads in each worker (several worker processes on one machine should share its cores)."""
    device = resolve_device(device)
    batch_size = int_option("batch_size", batch_size)
    chunk = extractor.chunk_for(device)
    if chunk:
        batch_size = -(-batch_size // chunk) * chunk
    return KeyedModelHandler(ExtractorModelHandler(extractor, device, batch_size, cpu_threads))
