"""DenseNet169 global features (1664-d): ``features`` -> ReLU -> global average pool.

That is the layer torchvision's DenseNet feeds its classifier, i.e. the pre-classification
features the paper uses. Weights are read from a local file only (see ``find_weights``).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from features.base import (
    GlobalExtractor,
    find_weights,
    load_state_dict,
    load_weights_into,
    register,
    resolve_device,
    weights_version,
    with_image_size,
)
from features.images import to_model_input
from features.registry import DENSENET169

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
FEATURE_DIM = DENSENET169.dim

# Release files name layers "denselayer1.norm.1.weight"; current modules are "denselayer1.norm1".
_OLD_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var|num_batches_tracked))$"
)


def remap_densenet_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Old-style DenseNet keys (``norm.1.weight``) -> current ones (``norm1.weight``)."""
    out = {}
    for key, value in state.items():
        m = _OLD_KEY.match(key)
        out[m.group(1) + m.group(2) if m else key] = value
    return out


class DenseNetFeatures(nn.Module):
    """Wraps a torchvision DenseNet: forward gives the pooled pre-classifier vector."""

    def __init__(self, densenet: nn.Module):
        super().__init__()
        self.features = densenet.features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(F.relu(self.features(x)), 1).flatten(1)


@register
class DenseNet169Extractor(GlobalExtractor):
    name = DENSENET169.name
    kind = DENSENET169.kind
    weight_files = (f"{DENSENET169.name}.pth", "densenet169-b2777c0a.pth")

    def __init__(self, *, weights: str | None = None, precision: str = "float32"):
        super().__init__(precision=precision)
        self.weights_path = find_weights(self.name, weights, self.weight_files)

    @property
    def version(self) -> str:
        return weights_version(self.weights_path, {"b2777c0a": "imagenet"})

    @property
    def dim(self) -> int:
        return FEATURE_DIM

    def preprocess(self, img: Image.Image) -> torch.Tensor:
        x = torch.from_numpy(to_model_input(img, 224, IMAGENET_MEAN, IMAGENET_STD, 256))
        return with_image_size(x, img.size)

    def load_model(self, device: str = "cpu") -> torch.nn.Module:
        from torchvision.models import densenet169

        net = densenet169(weights=None)
        state = remap_densenet_keys(load_state_dict(self.weights_path, self.name))
        load_weights_into(net, state, self.name, self.weights_path, optional_prefixes=("classifier.",))
        return DenseNetFeatures(net).to(resolve_device(device)).eval()
