"""The document-shard schema: one Parquet row per multi-image, multi-sentence document.

Why the schema version sits in every shard's metadata: a reader refuses a future layout instead
of mis-reading it. Plain Arrow types (pyarrow, DuckDB, polars read them) but for the feature
bytes (``schemas.feature_bytes``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

# Version history (``mmlinks data migrate`` upgrades older shards):
#   1: first layout.
#   2: regions gain per-box ``scores``; feature vectors may be stored as float16
#      (``mmlinks.feature_dtype`` metadata; readers cast to float32).
#   3: an image's global feature vector is stored as one byte string (``schemas.feature_bytes``:
#      the same values, ~2.7x cheaper to decode); readers still see ``list<float>``.
SCHEMA_VERSION = 3
# Versions whose feature vectors hold the same values, so a model trained on a dataset of one
# reads a dataset of another: v3 changed only how v2's vectors are stored.
SAME_FEATURES = ({2, 3},)


def same_features(a: int | str, b: int | str) -> bool:
    """Whether schema versions ``a`` and ``b`` (ints or their strings, as MLflow params are)
    hold the same feature values (``SAME_FEATURES``)."""
    a, b = str(a), str(b)
    return a == b or any({a, b} <= {str(v) for v in group} for group in SAME_FEATURES)


SCHEMA_NAME = "mmlinks.document-shard"
META_VERSION_KEY = b"mmlinks.schema_version"
META_NAME_KEY = b"mmlinks.schema_name"
META_DTYPE_KEY = b"mmlinks.feature_dtype"
FEATURE_DTYPES = {"float32": pa.float32(), "float16": pa.float16()}


def region_type(feature_dtype: str = "float32") -> pa.DataType:
    return pa.struct(
        [
            pa.field("boxes", pa.list_(pa.list_(pa.float32(), 4))),  # x0, y0, x1, y1 in pixels
            pa.field("vectors", pa.list_(pa.list_(FEATURE_DTYPES[feature_dtype]))),
            pa.field("labels", pa.list_(pa.string())),  # concept label of each region
            pa.field("scores", pa.list_(pa.float32())),  # detector / classifier confidence
        ]
    )


def image_type(feature_dtype: str = "float32") -> pa.DataType:
    return pa.struct(
        [
            pa.field("content_id", pa.string(), nullable=False),  # sha256 of the image bytes
            pa.field("uri", pa.string()),
            pa.field("width", pa.int32()),
            pa.field("height", pa.int32()),
            pa.field("phash", pa.uint64()),  # 64-bit DCT perceptual hash
            pa.field("features", pa.list_(FEATURE_DTYPES[feature_dtype])),  # global CNN vector
            pa.field("regions", region_type(feature_dtype)),  # region features (null when absent)
        ]
    )


LINK_TYPE = pa.struct(
    [pa.field("sentence", pa.int32(), nullable=False), pa.field("image", pa.int32(), nullable=False)]
)


def document_schema(feature_dtype: str = "float32") -> pa.Schema:
    if feature_dtype not in FEATURE_DTYPES:
        raise ValueError(f"feature dtype must be one of {sorted(FEATURE_DTYPES)}, not {feature_dtype!r}")
    return pa.schema(
        [
            pa.field("doc_id", pa.string(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("split", pa.string(), nullable=False),
            pa.field("sentences", pa.list_(pa.string()), nullable=False),
            pa.field("images", pa.list_(image_type(feature_dtype)), nullable=False),
            # null = the corpus has no ground truth; [] = labelled, no link in this document.
            pa.field("links", pa.list_(LINK_TYPE)),
            pa.field("metadata", pa.map_(pa.string(), pa.string())),
        ],
        metadata={
            META_VERSION_KEY: str(SCHEMA_VERSION).encode(),
            META_NAME_KEY: SCHEMA_NAME.encode(),
            META_DTYPE_KEY: feature_dtype.encode(),
        },
    )


@dataclass
class RegionFeatures:
    boxes: list[list[float]]
    vectors: list[list[float]]
    labels: list[str]
    scores: list[float] | None = None


@dataclass
class ImageRecord:
    content_id: str
    uri: str
    width: int
    height: int
    phash: int
    features: list[float] | None = None
    regions: RegionFeatures | None = None


@dataclass
class Document:
    """In-memory form of one shard row; ``links`` are (sentence index, image index) pairs."""

    doc_id: str
    source: str
    split: str
    sentences: list[str]
    images: list[ImageRecord]
    links: list[tuple[int, int]] | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict) -> Document:
        images = []
        for im in row["images"]:
            reg = im.get("regions")
            images.append(
                ImageRecord(
                    content_id=im["content_id"],
                    uri=im["uri"],
                    width=im["width"],
                    height=im["height"],
                    phash=im["phash"],
                    features=im["features"],
                    regions=None if reg is None else RegionFeatures(**reg),
                )
            )
        links = row.get("links")
        meta = row.get("metadata") or []
        return cls(
            doc_id=row["doc_id"],
            source=row["source"],
            split=row["split"],
            sentences=list(row["sentences"]),
            images=images,
            links=None if links is None else [(lk["sentence"], lk["image"]) for lk in links],
            metadata=dict(meta),
        )
