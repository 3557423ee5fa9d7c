"""Image feature extractors: what the build pipeline needs to know about a CNN backbone.

An extractor names its weights, output dimension and preprocessing, and gives Beam a
``ModelHandler`` so ``RunInference`` loads the model once per worker and batches images.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from pipelines.features import efficientnet_lite
from pipelines.images import to_model_input
from schemas.errors import MmlinksError


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
            min_batch_size=min_batch,
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
