"""EfficientNet-Lite0 extractors: the pooled 1280-d vector, and a grid of 1280-d cell vectors."""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from features import efficientnet_lite as lite
from features.base import (
    Extractor,
    GlobalExtractor,
    ImageFeatures,
    find_weights,
    int_option,
    load_state_dict,
    load_weights_into,
    need_image_size,
    raw_inference,
    register,
    resolve_device,
    weights_version,
    with_image_size,
)
from features.images import to_model_input
from features.registry import GRID_LITE0, LITE0
from schemas.errors import MmlinksError

RESIZE = 256
STRIDE = 32  # EfficientNet output stride
KNOWN_WEIGHTS = {"57934424": "imagenet"}


def _packaged_weights() -> Path | None:
    try:
        return lite.pretrained_weights_path()
    except ImportError:  # pragma: no cover - the package is a dependency
        return None


class _Lite0Base(Extractor):
    """Shared weights lookup and preprocessing (shorter side 256, centre crop 224)."""

    weight_files = (f"{LITE0.name}.pth", "efficientnet-lite0-57934424.pth")

    def __init__(self, *, weights: str | None = None, precision: str = "float32"):
        super().__init__(precision=precision)
        self.weights_path = find_weights(self.name, weights, self.weight_files, _packaged_weights())

    @property
    def version(self) -> str:
        return weights_version(self.weights_path, KNOWN_WEIGHTS)

    def preprocess(self, img: Image.Image) -> torch.Tensor:
        x = torch.from_numpy(to_model_input(img, lite.INPUT_SIZE, lite.INPUT_MEAN, lite.INPUT_STD, RESIZE))
        return with_image_size(x, img.size)

    def _load(self, model: torch.nn.Module, device: str) -> torch.nn.Module:
        load_weights_into(model, load_state_dict(self.weights_path, self.name), self.name, self.weights_path)
        # BatchNorm folded into the convolutions (1.4-1.55x images/s, docs/benchmarks.md) and
        # channels-last weights (the depthwise convolutions ~1.3x faster on CPU: 61 -> 78
        # images/s on 2 cores); outputs stay independent of batch composition.
        model = model.eval().fold_batchnorm()
        return model.to(resolve_device(device), memory_format=torch.channels_last)


@register
class EfficientNetLite0Extractor(_Lite0Base, GlobalExtractor):
    """ImageNet EfficientNet-Lite0, globally pooled last feature map (1280-d)."""

    name = LITE0.name
    kind = LITE0.kind

    @property
    def dim(self) -> int:
        return lite.FEATURE_DIM

    def load_model(self, device: str = "cpu") -> torch.nn.Module:
        return self._load(lite.EfficientNetLite0Features(), device)


class EfficientNetLite0Grid(lite.EfficientNetLite0):
    """Last feature map pooled to ``grid x grid`` cells; each cell classified by the ImageNet head."""

    def __init__(self, grid: int = 6):
        super().__init__()
        self.grid = grid

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        cells = F.adaptive_avg_pool2d(self.feature_map(x), self.grid).flatten(2).transpose(1, 2).contiguous()
        scores, labels = self._fc(cells).softmax(-1).max(-1)
        return {"vectors": cells, "scores": scores, "labels": labels}


@lru_cache(maxsize=1)
def imagenet_categories() -> tuple[str, ...]:
    from torchvision.models import ResNet50_Weights  # class names ship with torchvision (no download)

    return tuple(ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def _pool_bounds(n_in: int, n_out: int) -> list[tuple[int, int]]:
    """The [start, end) input cells each adaptive-average-pool output cell averages."""
    return [(i * n_in // n_out, -(-(i + 1) * n_in // n_out)) for i in range(n_out)]


def grid_boxes(image_size: tuple[int, int], grid: int, size: int = lite.INPUT_SIZE, resize: int = RESIZE):
    """float32 [grid*grid, 4] boxes (row-major) of each cell's pooling window, mapped through the
    centre crop and resize of ``to_model_input`` back to original pixels (x0, y0, x1, y1)."""
    w, h = image_size
    scale = resize / min(w, h)
    rw, rh = max(size, round(w * scale)), max(size, round(h * scale))  # as in to_model_input
    left, top = (rw - size) // 2, (rh - size) // 2
    n_cells = math.ceil(size / STRIDE)
    px = size / n_cells  # crop pixels per feature-map cell
    bounds = _pool_bounds(n_cells, grid)
    boxes = [
        (
            (left + x0 * px) * w / rw,
            (top + y0 * px) * h / rh,
            (left + x1 * px) * w / rw,
            (top + y1 * px) * h / rh,
        )
        for (y0, y1) in bounds
        for (x0, x1) in bounds
    ]
    out = np.asarray(boxes, dtype=np.float32)
    np.clip(out, 0, [w, h, w, h], out=out)
    return out


@register
class GridLite0Extractor(_Lite0Base):
    """EfficientNet-Lite0 grid regions (offline stand-in for detector regions): the last feature
    map (1280 x 7 x 7 at 224) adaptive-average-pooled to ``grid x grid`` cells; label/score = the
    ImageNet head's top class and probability for each cell vector."""

    name = GRID_LITE0.name
    kind = GRID_LITE0.kind

    def __init__(self, *, weights: str | None = None, grid: int = 6, precision: str = "float32"):
        super().__init__(weights=weights, precision=precision)
        cells = math.ceil(lite.INPUT_SIZE / STRIDE)
        self.grid = int_option("grid", grid)
        if self.grid > cells:
            raise MmlinksError(f"option grid must be <= {cells} (the last feature map is {cells}x{cells})")
        self._options["grid"] = self.grid

    @property
    def dim(self) -> int:
        return lite.FEATURE_DIM

    def load_model(self, device: str = "cpu") -> torch.nn.Module:
        return self._load(EfficientNetLite0Grid(self.grid), device)

    def postprocess(self, inference: Any, image_size: tuple[int, int] | None = None) -> ImageFeatures:
        raw = raw_inference(inference)
        names = imagenet_categories()
        return ImageFeatures(
            regions={
                "boxes": grid_boxes(need_image_size(self, image_size, raw), self.grid),
                "vectors": self._cast(raw["vectors"]),
                "labels": [names[int(i)] for i in raw["labels"]],
                "scores": np.asarray(raw["scores"], dtype=np.float32),
            }
        )
