"""Faster R-CNN (ResNet-50 FPN, COCO) region features: top-N boxes with their 1024-d box-head vectors.

Each kept detection is pooled again through the box head (the vector the classifier sees). Why
one image per forward: the detector pads a batch to its largest image, so batching would make an
image's features depend on its neighbours."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from features.base import (
    Extractor,
    ImageFeatures,
    find_weights,
    float_option,
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
from features.registry import FASTERRCNN
from schemas.errors import MmlinksError

REPRESENTATION_DIM = FASTERRCNN.dim


@lru_cache(maxsize=1)
def coco_categories() -> tuple[str, ...]:
    from torchvision.models.detection import FasterRCNN_ResNet50_FPN_Weights  # names only, no download

    return tuple(FasterRCNN_ResNet50_FPN_Weights.COCO_V1.meta["categories"])


def build_fasterrcnn(**kwargs: Any) -> nn.Module:
    """torchvision's fasterrcnn_resnet50_fpn as built for the COCO weights (FrozenBatchNorm2d
    backbone), without downloading anything."""
    from torchvision.models import resnet50
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    from torchvision.models.detection.faster_rcnn import FasterRCNN
    from torchvision.ops.misc import FrozenBatchNorm2d

    backbone = _resnet_fpn_extractor(resnet50(weights=None, norm_layer=FrozenBatchNorm2d), 3)
    return FasterRCNN(backbone, num_classes=len(coco_categories()), **kwargs)


def detector_input_size(width: int, height: int, min_size: int, max_size: int) -> tuple[int, int]:
    """The (width, height) the detector's transform resizes to: shorter side ``min_size`` unless
    the longer side would exceed ``max_size``. Resizing to it in preprocess keeps the tensors small
    and makes the transform's own resize an exact identity (scale factor 1.0)."""
    short, long = min(width, height), max(width, height)
    new_long = round(long * min_size / short)
    if new_long <= max_size:
        new_short = min_size
    else:
        new_long, new_short = max_size, min(min_size, round(short * max_size / long))
    return (new_long, new_short) if width >= height else (new_short, new_long)


class RegionDetector(nn.Module):
    """forward(one CHW image in [0, 1]) -> detections plus the box-head vector of each kept box."""

    def __init__(self, detector: nn.Module):
        super().__init__()
        self.detector = detector

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        m = self.detector
        h, w = int(image.shape[-2]), int(image.shape[-1])
        images, _ = m.transform([image])
        feats = m.backbone(images.tensors)
        proposals, _ = m.rpn(images, feats)
        dets, _ = m.roi_heads(feats, proposals, images.image_sizes)
        boxes = dets[0]["boxes"]
        if len(boxes):
            pooled = m.roi_heads.box_roi_pool(feats, [boxes], images.image_sizes)
            vectors = m.roi_heads.box_head(pooled)
        else:
            vectors = boxes.new_zeros((0, m.roi_heads.box_head.fc7.out_features))
        det = m.transform.postprocess(dets, images.image_sizes, [(h, w)])[0]
        return {
            "boxes": det["boxes"],  # in the input tensor's pixels
            "scores": det["scores"],
            "labels": det["labels"],
            "vectors": vectors,
            "input_size": torch.tensor([w, h]),
        }


@register
class FasterRCNNExtractor(Extractor):
    name = FASTERRCNN.name
    kind = FASTERRCNN.kind
    forward_chunk = None  # one image per forward
    weight_files = (f"{FASTERRCNN.name}.pth", "fasterrcnn_resnet50_fpn_coco-258fb6c6.pth")

    def __init__(
        self,
        *,
        weights: str | None = None,
        num_regions: int = 36,
        box_score_thresh: float = 0.0,
        box_nms_thresh: float = 0.5,
        min_size: int = 800,
        max_size: int = 1333,
        precision: str = "float32",
    ):
        super().__init__(precision=precision)
        self.num_regions = int_option("num_regions", num_regions)
        self.box_score_thresh = float_option("box_score_thresh", box_score_thresh, 0.0, 1.0)
        self.box_nms_thresh = float_option("box_nms_thresh", box_nms_thresh, 0.0, 1.0)
        self.min_size = int_option("min_size", min_size, 32)
        self.max_size = int_option("max_size", max_size, 32)
        if self.max_size < self.min_size:
            raise MmlinksError(f"option max_size ({max_size}) must be >= min_size ({min_size})")
        self._options.update(
            num_regions=self.num_regions,
            box_score_thresh=self.box_score_thresh,
            box_nms_thresh=self.box_nms_thresh,
            min_size=self.min_size,
            max_size=self.max_size,
        )
        self.weights_path = find_weights(self.name, weights, self.weight_files)

    @property
    def version(self) -> str:
        return weights_version(self.weights_path, {"258fb6c6": "coco"})

    @property
    def dim(self) -> int:
        return REPRESENTATION_DIM

    def preprocess(self, img: Image.Image) -> torch.Tensor:
        original = img.size
        img = img.convert("RGB")
        size = detector_input_size(*img.size, self.min_size, self.max_size)
        if size != img.size:
            img = img.resize(size, Image.BILINEAR)
        arr = np.asarray(img, dtype=np.float32) / 255.0  # the detector normalises internally
        return with_image_size(torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))), original)

    def load_model(self, device: str = "cpu") -> torch.nn.Module:
        detector = build_fasterrcnn(
            min_size=self.min_size,
            max_size=self.max_size,
            box_score_thresh=self.box_score_thresh,
            box_nms_thresh=self.box_nms_thresh,
            box_detections_per_img=self.num_regions,
        )
        load_weights_into(
            detector, load_state_dict(self.weights_path, self.name), self.name, self.weights_path
        )
        return RegionDetector(detector).to(resolve_device(device)).eval()

    def postprocess(self, inference: Any, image_size: tuple[int, int] | None = None) -> ImageFeatures:
        raw = raw_inference(inference)
        w, h = need_image_size(self, image_size, raw)
        tw, th = (int(v) for v in raw["input_size"])
        scale = np.asarray([w / tw, h / th, w / tw, h / th])
        boxes = (raw["boxes"].numpy().astype(np.float64) * scale).astype(np.float32).reshape(-1, 4)
        np.clip(boxes, 0, np.asarray([w, h, w, h], dtype=np.float32), out=boxes)
        names = coco_categories()
        return ImageFeatures(
            regions={
                "boxes": boxes,
                "vectors": self._cast(raw["vectors"]).reshape(-1, self.dim),
                "labels": [names[int(i)] for i in raw["labels"]],
                "scores": raw["scores"].numpy().astype(np.float32),
            }
        )
