"""Batch-linking output: the link-shard schema and the link manifest (``mmlinks link``).

A link folder mirrors a dataset folder (``versions/<link_version>/`` shards, ``manifest.json``
last); a row holds each image's linked sentence (null: unlinked) and score. Why the manifest pins
model, dataset version and extractor: a reader can tell whether the links are still current."""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.errors import MmlinksError
from schemas.manifest import MANIFEST_NAME, FeatureExtractorInfo, Manifest, ShardInfo

LINKS_SCHEMA_VERSION = 1
LINKS_SCHEMA_NAME = "mmlinks.links"


def link_schema() -> pa.Schema:
    """One row per document; ``sentence``/``score`` have one entry per image, in image order."""
    return pa.schema(
        [
            pa.field("doc_id", pa.string(), nullable=False),
            pa.field("split", pa.string(), nullable=False),
            pa.field("n_sentences", pa.int32(), nullable=False),
            pa.field("n_images", pa.int32(), nullable=False),
            pa.field("sentence", pa.list_(pa.int32()), nullable=False),  # null entry: unlinked image
            pa.field("score", pa.list_(pa.float32()), nullable=False),  # null entry: unlinked image
            pa.field("scores", pa.list_(pa.list_(pa.float32()))),  # n x m, only with --keep-scores
        ],
        metadata={b"mmlinks.schema": LINKS_SCHEMA_NAME.encode(), b"mmlinks.version": b"1"},
    )


def link_shard_bytes(rows: list[dict]) -> bytes:
    """Rows (already in their final order) -> the bytes of one Parquet shard; equal rows give
    equal bytes."""
    table = pa.Table.from_pylist(rows, schema=link_schema())
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=1024, compression="zstd")
    return buf.getvalue()


@dataclass
class ModelInfo:
    uri: str  # as asked, e.g. models:/mmlinks-ap@production
    name: str | None  # None for a runs:/ URI
    version: str | None  # the concrete version the URI resolved to, once, before the job ran
    run_id: str | None


@dataclass
class LinkManifest:
    schema_version: int
    link_version: str
    dataset_version: str
    dataset_source: str
    feature_extractor: FeatureExtractorInfo
    model: ModelInfo
    params: dict  # assignment, min score, split, batching: what defines the links with the model
    counts: dict  # documents read / linked / dead-lettered, images, linked images, dead per reason
    shards: list[ShardInfo]
    dead_letter: str | None = None
    evaluation: dict | None = None  # with --eval: link P/R/F1 and per-document AUC, p@1, p@5
    extra: dict = field(default_factory=dict)

    @staticmethod
    def version_id(shards: list[ShardInfo], identity: dict) -> str:
        """The dataset manifest's hash (shard names, checksums, parameters), so link versions
        and dataset versions are named the same way."""
        return Manifest.version_id(shards, identity)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, allow_nan=False, default=str) + "\n"

    def shard_paths(self, directory: str | Path) -> list[Path]:
        return [Path(directory) / s.path for s in self.shards]

    @classmethod
    def read(cls, path: str | Path) -> LinkManifest:
        """``path``: the manifest file or the link folder holding it."""
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_NAME
        try:
            data = json.loads(path.read_text())
            if int(data["schema_version"]) != LINKS_SCHEMA_VERSION or "link_version" not in data:
                raise MmlinksError(f"{path} is not a link manifest of version {LINKS_SCHEMA_VERSION}")
            return cls(
                **{
                    **data,
                    "feature_extractor": FeatureExtractorInfo(**data["feature_extractor"]),
                    "model": ModelInfo(**data["model"]),
                    "shards": [ShardInfo(**s) for s in data["shards"]],
                }
            )
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise MmlinksError(f"cannot read link manifest {path}: {type(exc).__name__}: {exc}") from exc
