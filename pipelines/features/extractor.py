"""Image feature extractors: what the build pipeline needs to know about a CNN backbone.

An extractor names its weights, output dimension and preprocessing, and gives Beam a
``ModelHandler`` so ``RunInference`` loads the model once per worker and batches images.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from pipelines.features import efficientnet_lite
from pipelines.images import to_model_input
from schemas.errors import MmlinksError

FORWARD_CHUNK = 8


def fixed_chunk_inference(
    batch: Sequence[torch.Tensor], model: torch.nn.Module, device, inference_args=None, model_id=None
):
    """Run the model on fixed-size chunks (the last one zero-padded).

    CPU kernels pick different code paths for different batch sizes, so an image's features
    can change in the last bits with the size of the batch it lands in, and RunInference sizes
    batches by timing. A fixed forward size makes every image's features independent of its
    batch, so rebuilding the same inputs gives byte-identical shards.
    """
    from apache_beam.ml.inference.base import PredictionResult

    x = torch.stack(list(batch)).to(device)
    outs = []
    with torch.no_grad():
        for start in range(0, len(x), FORWARD_CHUNK):
            chunk = x[start : start + FORWARD_CHUNK]
            n = len(chunk)
            if n < FORWARD_CHUNK:
                chunk = torch.cat([chunk, chunk.new_zeros(FORWARD_CHUNK - n, *chunk.shape[1:])])
            outs.append(model(chunk)[:n].cpu())
    return [PredictionResult(ex, out, model_id) for ex, out in zip(batch, torch.cat(outs), strict=True)]


@dataclass(frozen=True)
class FeatureExtractor:
    name: str
    version: str
    dim: int
    input_size: int
    resize: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def preprocess(self, img: Image.Image) -> np.ndarray:
        return to_model_input(img, self.input_size, self.mean, self.std, self.resize)

    def model_handler(self, device: str = "cpu", min_batch: int = 8, max_batch: int = 32):
        from apache_beam.ml.inference.base import KeyedModelHandler
        from apache_beam.ml.inference.pytorch_inference import PytorchModelHandlerTensor

        if self.name != "efficientnet-lite0":  # pragma: no cover - registry is closed for now
            raise MmlinksError(f"no model handler for {self.name}")
        handler = PytorchModelHandlerTensor(
            state_dict_path=str(efficientnet_lite.pretrained_weights_path()),
            model_class=efficientnet_lite.EfficientNetLite0Features,
            model_params={},
            device="GPU" if device == "cuda" else "CPU",
            inference_fn=fixed_chunk_inference,
            min_batch_size=min(min_batch, max_batch),
            max_batch_size=max_batch,
        )
        return KeyedModelHandler(handler)


EXTRACTORS = {
    "efficientnet-lite0": FeatureExtractor(
        name="efficientnet-lite0",
        # the weight file name carries the checksum prefix of the published weights
        version="imagenet-57934424",
        dim=efficientnet_lite.FEATURE_DIM,
        input_size=efficientnet_lite.INPUT_SIZE,
        resize=256,
        mean=efficientnet_lite.INPUT_MEAN,
        std=efficientnet_lite.INPUT_STD,
    ),
}


def get_extractor(name: str) -> FeatureExtractor:
    try:
        return EXTRACTORS[name]
    except KeyError:
        raise MmlinksError(f"unknown feature extractor {name!r}; known: {sorted(EXTRACTORS)}") from None
