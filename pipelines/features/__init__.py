"""Image feature extractors (pluggable registry); see ``pipelines.features.base``.

``get_extractor(name, **options)`` gives a configured extractor; ``EXTRACTORS`` lists them.
"""

from pipelines.features import densenet, detection, lite0  # noqa: F401  (registers the built-ins)
from pipelines.features.base import (
    EXTRACTORS,
    FORWARD_CHUNK,
    Extractor,
    GlobalExtractor,
    ImageFeatures,
    extractor_options,
    fixed_chunk_forward,
    get_extractor,
    register,
    resolve_device,
    tune_cpu_malloc,
)

__all__ = [
    "EXTRACTORS",
    "FORWARD_CHUNK",
    "Extractor",
    "GlobalExtractor",
    "ImageFeatures",
    "extractor_options",
    "fixed_chunk_forward",
    "get_extractor",
    "register",
    "resolve_device",
    "tune_cpu_malloc",
]
