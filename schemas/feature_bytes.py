"""How a shard stores each image's global feature vector: one little-endian byte string.

Why binary (schema v3) over ``list<float>``: Parquet decoded a repetition and definition level
per float, most of a shard's read cost (~54 -> ~20 CPU-us per document, issue #16,
docs/benchmarks.md; ``fixed_size_list`` kept the levels). ``decode_features`` gives readers the
logical ``list<float>`` view almost free; outside mmlinks, ``numpy.frombuffer(value, "<f4")``."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.document import FEATURE_DTYPES, META_DTYPE_KEY
from schemas.errors import MmlinksError

FEATURES_FIELD = "features"
STORED_TYPE = pa.binary()
NUMPY_DTYPES = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}
LIST_ITEM = "element"  # the item name Parquet readers give list values (so decoded = v2 as read)


def shard_feature_dtype(schema: pa.Schema) -> str:
    """The feature dtype a shard's schema metadata names (float32 when absent: v1 shards)."""
    raw = (schema.metadata or {}).get(META_DTYPE_KEY, b"float32").decode()
    if raw not in FEATURE_DTYPES:
        raise MmlinksError(f"unknown feature dtype {raw!r} in the shard metadata")
    return raw


def stored_dtype(table: pa.Table, dtype: str | None) -> str:
    """The dtype of a table's stored feature bytes: ``dtype`` when given, else its schema
    metadata's. Refuses a table without either: float16 bytes read as float32 would give
    vectors half as wide, of garbage, with no other error (a record batch or a Ray batch
    carries no metadata)."""
    if dtype is not None:
        return dtype
    if META_DTYPE_KEY not in (table.schema.metadata or {}):
        raise MmlinksError("stored feature bytes without their dtype (no mmlinks.feature_dtype metadata)")
    return shard_feature_dtype(table.schema)


MAX_CHUNK_BYTES = 2**31 - 1  # a binary array's int32 offsets


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "float16" else 4


def _mask(arr: pa.Array) -> pa.Array | None:
    return pc.is_null(arr) if arr.null_count else None


def vectors_to_bytes(vectors: pa.Array, dtype: str) -> pa.Array:
    """``list<float>`` vectors (one per image; null = no features) -> ``binary`` byte strings of
    the same values, little-endian. Raises MmlinksError on a null value inside a vector."""
    np_dtype = np.dtype(np.float16 if dtype == "float16" else np.float32).newbyteorder("<")
    offsets = np.asarray(vectors.offsets, np.int64)  # respects the array's own offset
    flat = vectors.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if flat.null_count:
        raise MmlinksError("a feature vector holds a null value; features must be numbers")
    values = flat.to_numpy(zero_copy_only=False).astype(np_dtype, copy=False)
    size = np_dtype.itemsize
    if (offsets[-1] - offsets[0]) * size > MAX_CHUNK_BYTES:
        raise MmlinksError(
            "more than 2 GiB of feature vectors in one shard chunk: write smaller shards (--max-shard-mb)"
        )
    byte_offsets = pa.array(((offsets - offsets[0]) * size).astype(np.int32), pa.int32())
    data = pa.py_buffer(np.ascontiguousarray(values).tobytes())
    out = pa.BinaryArray.from_buffers(STORED_TYPE, len(vectors), [None, byte_offsets.buffers()[1], data])
    mask = _mask(vectors)
    return out if mask is None else pc.if_else(mask, pa.scalar(None, STORED_TYPE), out)


def bytes_to_vectors(stored: pa.Array, dtype: str) -> pa.Array:
    """``binary`` byte strings -> ``list<float>`` vectors, the values viewed in place (no copy).
    Raises MmlinksError when a byte string is not a whole number of values."""
    if sys.byteorder != "little":  # Arrow's floats are native-endian; the bytes are little-endian
        raise MmlinksError("reading stored feature vectors needs a little-endian machine")
    size = _itemsize(dtype)
    offsets = np.frombuffer(stored.buffers()[1], np.int32)[stored.offset : stored.offset + len(stored) + 1]
    if len(offsets) == 0:
        offsets = np.zeros(1, np.int32)
    if (offsets % size).any():  # absolute: the values viewed in place stay aligned
        raise MmlinksError(f"a stored feature vector is not a whole number of {dtype} values")
    start, stop = int(offsets[0]), int(offsets[-1])
    data = stored.buffers()[2]
    values = pa.Array.from_buffers(
        FEATURE_DTYPES[dtype],
        (stop - start) // size,
        [None, None if data is None else data.slice(start, stop - start)],
    )
    list_offsets = pa.array((offsets - offsets[0]) // size, pa.int32())
    return pa.ListArray.from_arrays(
        list_offsets, values, type=pa.list_(pa.field(LIST_ITEM, FEATURE_DTYPES[dtype])), mask=_mask(stored)
    )


def _map_images(column: pa.ChunkedArray, convert, to_type: pa.DataType) -> pa.ChunkedArray:
    """Apply ``convert`` (-> ``to_type``) to the ``features`` field of every image of an
    ``images`` column."""
    struct = column.type.value_type
    fields = [f.with_type(to_type) if f.name == FEATURES_FIELD else f for f in struct]
    list_type = pa.list_(column.type.value_field.with_type(pa.struct(fields)))
    return pa.chunked_array([_map_chunk(chunk, convert, list_type) for chunk in column.chunks], list_type)


def _map_chunk(images: pa.ListArray, convert, list_type: pa.DataType) -> pa.ListArray:
    struct = images.values  # every image of the chunk (the list's offsets index into it)
    children = [struct.field(i) for i in range(struct.type.num_fields)]  # adjusted for its offset
    children = [
        convert(c) if f.name == FEATURES_FIELD else c for f, c in zip(struct.type, children, strict=True)
    ]
    rebuilt = pa.StructArray.from_arrays(children, fields=list(list_type.value_type), mask=_mask(struct))
    return pa.ListArray.from_arrays(images.offsets, rebuilt, type=list_type, mask=_mask(images))


def _has_features(table: pa.Table) -> bool:
    if "images" not in table.column_names:
        return False
    struct = table.schema.field("images").type.value_type
    return pa.types.is_struct(struct) and struct.get_field_index(FEATURES_FIELD) >= 0


def _replace_images(table: pa.Table, column: pa.ChunkedArray) -> pa.Table:
    i = table.schema.get_field_index("images")
    field = table.schema.field(i).with_type(column.type)
    return table.set_column(i, field, column).replace_schema_metadata(table.schema.metadata)


def decode_features(table: pa.Table, dtype: str | None = None) -> pa.Table:
    """A table as read from a v3 shard -> the logical layout (``images.features`` as
    ``list<float>``). ``dtype`` defaults to the table's metadata; a table already in the
    logical layout, or without the features field, is returned as is."""
    if not _has_features(table):
        return table
    stored = table.schema.field("images").type.value_type.field(FEATURES_FIELD).type
    if not pa.types.is_binary(stored):
        return table
    dtype = stored_dtype(table, dtype)
    to_type = pa.list_(pa.field(LIST_ITEM, FEATURE_DTYPES[dtype]))
    return _replace_images(
        table, _map_images(table.column("images"), lambda a: bytes_to_vectors(a, dtype), to_type)
    )


def encode_features(table: pa.Table, dtype: str) -> pa.Table:
    """A table in the logical layout -> the stored one (``images.features`` as ``binary``)."""
    if not _has_features(table):
        return table
    return _replace_images(
        table, _map_images(table.column("images"), lambda a: vectors_to_bytes(a, dtype), STORED_TYPE)
    )


def feature_values(table: pa.Table, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(every image's feature vector as rows of one [images, D] array, viewed in place and
    read-only, in the stored dtype; the number of images of each document) of a table's
    ``images.features``, stored (bytes) or logical (``list<float>``) layout alike: the bulk
    read the link job and training do per table, with no Arrow compute call per column (each
    costs more than the numpy arithmetic on one table's offsets). ``dtype`` defaults to the
    table's metadata (bytes only; MmlinksError without either). Raises ValueError when the
    vectors of the table differ in width, one is null or one is not a whole number of values:
    callers then go row by row."""
    column = table.column("images")
    # one chunk (a batch) is read in place; combine_chunks would copy every vector
    images = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    doc_offsets = np.asarray(images.offsets, np.int64)
    counts = np.diff(doc_offsets)
    first, total = int(doc_offsets[0]), int(doc_offsets[-1] - doc_offsets[0])
    structs = images.values.slice(first, total)  # this table's images
    feats = images.values.field(FEATURES_FIELD).slice(first, total)
    if total == 0:
        return np.zeros((0, 0), np.float32), counts
    if feats.null_count or structs.null_count:
        raise ValueError("an image of the table has no feature vector")
    if pa.types.is_binary(feats.type):
        dtype = stored_dtype(table, dtype)
        size = _itemsize(dtype)
        offsets = np.frombuffer(feats.buffers()[1], np.int32)[feats.offset : feats.offset + total + 1]
        if (offsets % size).any():  # a damaged vector: the caller goes row by row
            raise ValueError(f"a stored feature vector is not a whole number of {dtype} values")
        flat = np.frombuffer(feats.buffers()[2], NUMPY_DTYPES[dtype])[
            offsets[0] // size : offsets[-1] // size
        ]
        offsets = offsets // size
    else:
        offsets = np.asarray(feats.offsets, np.int64)
        values = feats.values
        flat = values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    widths = np.diff(offsets)
    d = int(widths[0])
    if (widths != d).any():
        raise ValueError("images in one table have feature vectors of different lengths")
    return flat.reshape(total, d), counts
