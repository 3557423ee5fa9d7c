"""The one list of built-in feature extractors: name -> :class:`ExtractorSpec`.

Why one list that imports nothing heavy: every name is spelled here only, and ``--help`` lists
them without loading a model library; :func:`load_builtin` imports a spec's implementation."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ExtractorSpec:
    name: str
    kind: str  # "global" (one vector per image) | "regions" (boxes + region vectors)
    summary: str  # one line for --help and docs
    dim: int  # length of a global vector or of one region vector
    module: str  # the module whose registered class implements it
    class_name: str
    needs_weights: bool  # True: no usable weights ship with the installed packages


LITE0 = ExtractorSpec(
    "efficientnet-lite0",
    "global",
    "ImageNet EfficientNet-Lite0, pooled last feature map (offline default; weights ship as a package)",
    1280,
    "features.lite0",
    "EfficientNetLite0Extractor",
    needs_weights=False,
)
DENSENET169 = ExtractorSpec(
    "densenet169",
    "global",
    "ImageNet DenseNet169 pre-classifier features (the paper's; needs --weights)",
    1664,
    "features.densenet",
    "DenseNet169Extractor",
    needs_weights=True,
)
FASTERRCNN = ExtractorSpec(
    "fasterrcnn-r50-fpn",
    "regions",
    "Faster R-CNN ResNet-50 FPN (COCO) top-N boxes with 1024-d box-head vectors (needs --weights)",
    1024,
    "features.detection",
    "FasterRCNNExtractor",
    needs_weights=True,
)
GRID_LITE0 = ExtractorSpec(
    "grid-lite0",
    "regions",
    "EfficientNet-Lite0 feature map pooled to a grid of cells (offline stand-in for detector regions)",
    1280,
    "features.lite0",
    "GridLite0Extractor",
    needs_weights=False,
)
CLIP_VIT_B32 = ExtractorSpec(
    "clip-vit-b32",
    "global",
    "CLIP image embeddings (open_clip ViT-B/32 by default, option model=; mmc4's zero-shot linker; "
    "needs --weights)",
    512,
    "features.clip",
    "ClipViTB32Extractor",
    needs_weights=True,
)

# The order is the order of --help.
BUILTIN_EXTRACTORS: dict[str, ExtractorSpec] = {
    s.name: s for s in (LITE0, DENSENET169, FASTERRCNN, GRID_LITE0, CLIP_VIT_B32)
}
DEFAULT_EXTRACTOR = LITE0.name


def global_extractor_names() -> list[str]:
    return [n for n, s in BUILTIN_EXTRACTORS.items() if s.kind == "global"]


def region_extractor_names() -> list[str]:
    return [n for n, s in BUILTIN_EXTRACTORS.items() if s.kind == "regions"]


def load_builtin(spec: ExtractorSpec) -> type:
    """The class implementing ``spec`` (importing its module registers it)."""
    return getattr(importlib.import_module(spec.module), spec.class_name)


def describe_extractors(kind: str) -> str:
    """``name (summary), ...`` of one kind, for help texts."""
    return "; ".join(f"{s.name}: {s.summary}" for s in BUILTIN_EXTRACTORS.values() if s.kind == kind)
