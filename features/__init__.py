"""Image feature extractors and image decoding; no Beam, no pipelines imports.

``get_extractor(name, **options)`` gives a configured extractor and ``EXTRACTORS`` maps names to
classes. Why the torch-backed names load on first access: ``import features.registry`` (the
CLI's help) stays cheap."""

from __future__ import annotations

import importlib
from typing import Any

_FROM_BASE = (
    "EXTRACTORS",
    "Extractor",
    "GlobalExtractor",
    "ImageFeatures",
    "extractor_options",
    "fixed_chunk_forward",
    "get_extractor",
    "register",
    "resolve_device",
)
_FROM_CPU_HEAP = ("HeapTrim", "tune_cpu_heap", "tune_cpu_malloc")

_SUBMODULES = (
    "base",
    "clip",
    "cpu_heap",
    "densenet",
    "detection",
    "efficientnet_lite",
    "images",
    "lite0",
    "registry",
)


def __getattr__(name: str) -> Any:
    if name in _FROM_BASE:
        base = importlib.import_module("features.base")
        base.load_builtins()
        return getattr(base, name)
    if name in _FROM_CPU_HEAP:
        return getattr(importlib.import_module("features.cpu_heap"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"features.{name}")
    raise AttributeError(f"module 'features' has no attribute {name!r}")


__all__ = [*_FROM_BASE, *_FROM_CPU_HEAP]
