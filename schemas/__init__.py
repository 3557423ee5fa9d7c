"""Record types and versioned Arrow/Parquet schemas shared by pipelines and training."""

from schemas.document import (
    SCHEMA_VERSION,
    Document,
    ImageRecord,
    RegionFeatures,
    document_schema,
)
from schemas.errors import MmlinksError
from schemas.manifest import Manifest, ShardInfo

__all__ = [
    "SCHEMA_VERSION",
    "Document",
    "ImageRecord",
    "Manifest",
    "MmlinksError",
    "RegionFeatures",
    "ShardInfo",
    "document_schema",
]
