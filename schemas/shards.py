"""Reading and writing document shards, with the schema-version check every reader needs."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.document import (
    FEATURE_DTYPES,
    META_NAME_KEY,
    META_VERSION_KEY,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    Document,
    document_schema,
    image_type,
    region_type,
)
from schemas.errors import MmlinksError
from schemas.feature_bytes import decode_features, encode_features

ROW_GROUP_ROWS = 256
ROW_GROUP_BYTES = 64 * 1024 * 1024  # bound a row group's (estimated) size: readers stream by group
# The image features are most of a shard's bytes and of its decode time (stored as one byte
# string per image since v3: schemas.feature_bytes). Float vectors do not repeat, so a
# dictionary never forms (Parquet tries one, then falls back page by page) and ZSTD gains little
# on them: LZ4 without a dictionary decodes in ~35 % less CPU than ZSTD with one (measured on
# v2's list<float>: 0.45 vs 0.68-0.77 CPU-s for 5,000 documents of 2 x 1,280 floats) for 6 %
# more bytes (112.5 vs 105.7 MB), and writes faster. Uncompressed bytes would decode in ~8 us a
# document instead of ~19 (6.5 x 1,280 floats) for 1.5x the bytes: not worth it at corpus scale.
# Every other column keeps ZSTD and dictionaries.
# (docs/benchmarks.md, issue #16: the linking job reads every feature of a dataset.)
FEATURES_COLUMN = "images.list.element.features"
FEATURES_CODEC = "lz4"
OTHER_CODEC = "zstd"


def check_schema(schema: pa.Schema, where: str | Path) -> None:
    """Refuse shards that are not mmlinks shards or come from an unknown schema version."""
    meta = schema.metadata or {}
    if meta.get(META_NAME_KEY) != SCHEMA_NAME.encode():
        raise MmlinksError(f"{where} is not an mmlinks document shard (no schema name metadata)")
    raw = meta.get(META_VERSION_KEY, b"?").decode()
    if raw != str(SCHEMA_VERSION):
        hint = (
            "run `mmlinks data migrate DATASET_DIR` to upgrade it"
            if raw.isdigit() and int(raw) < SCHEMA_VERSION
            else "upgrade mmlinks or rebuild the dataset"
        )
        raise MmlinksError(
            f"{where} has document schema version {raw}; this mmlinks reads version {SCHEMA_VERSION} ({hint})"
        )


# Shards whose bytes matched their manifest, by (path, size, mtime): hashed once per process.
_VERIFIED: dict[tuple[str, int, int], str] = {}
_HASH_CHUNK = 1 << 20


def verify_shard(path: str | Path, sha256: str, size: int | None = None) -> None:
    """Refuse a shard whose bytes are not the ones its manifest committed, naming the file.

    A shard changed after the commit (a bad disk, a partial copy, a hand edit) would otherwise be
    read as if it were the dataset version the manifest names. Size first (no read), then the
    sha256; a match is remembered for the file's (size, mtime). When the file's footer names
    another schema version, that error (with its migration hint) is raised instead.
    """
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise MmlinksError(f"shard {p} named by the manifest is missing; rebuild the dataset") from None
    key = (str(p), st.st_size, st.st_mtime_ns)
    if _VERIFIED.get(key) == sha256:
        return
    if size is not None and st.st_size != size:
        found = f"{st.st_size} bytes where the manifest says {size}"
    else:
        h = hashlib.sha256()
        with p.open("rb") as fh:
            while chunk := fh.read(_HASH_CHUNK):
                h.update(chunk)
        if h.hexdigest() == sha256:
            _VERIFIED[key] = sha256
            return
        found = f"sha256 {h.hexdigest()[:12]} where the manifest says {sha256[:12]}"
    try:
        schema = pq.read_schema(p)
    except (OSError, pa.ArrowInvalid):
        schema = None
    if schema is not None:
        check_schema(schema, p)  # another schema version: say that, with its hint
    raise MmlinksError(
        f"shard {p} is not the file the manifest committed ({found}): it changed after the build; "
        "rebuild the dataset"
    )


def check_shards(paths: Iterable[str | Path]) -> None:
    """Check every shard's existence and schema version from its footer alone (no data read)."""
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise MmlinksError(f"shard {p} does not exist")
        try:
            schema = pq.read_schema(p)
        except (OSError, pa.ArrowInvalid) as exc:
            raise MmlinksError(f"cannot read shard {p}: {exc}") from exc
        check_schema(schema, p)


def _offsets(lengths: Sequence[int]) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32), pa.int32())


def _vectors(rows: list, dtype: pa.DataType) -> pa.Array:
    """list<dtype> from a list of 1-D arrays (None = null), built from one flat buffer."""
    np_dtype = np.float16 if dtype == pa.float16() else np.float32
    lengths = [0 if r is None else len(r) for r in rows]
    flat = [np.asarray(r, dtype=np_dtype).ravel() for r in rows if r is not None]
    values = pa.array(np.concatenate(flat) if flat else np.zeros(0, np_dtype), type=dtype)
    mask = pa.array([r is None for r in rows], pa.bool_())
    return pa.ListArray.from_arrays(
        _offsets(lengths), values, mask=mask if any(r is None for r in rows) else None
    )


def _nested_vectors(groups: list, dtype: pa.DataType) -> pa.Array:
    """list<list<dtype>> from a list of 2-D arrays (rows = vectors)."""
    inner = [np.asarray(row) for g in groups for row in g]
    return pa.ListArray.from_arrays(_offsets([len(g) for g in groups]), _vectors(inner, dtype))


def _regions(images: list, feature_dtype: str) -> pa.Array:
    regs = [im.regions for im in images]
    present = [r for r in regs if r is not None]
    dtype = FEATURE_DTYPES[feature_dtype]
    rtype = region_type(feature_dtype)
    # Images without regions get empty children and a null slot.
    filled = regs
    boxes = [
        np.asarray(r.boxes, np.float32).reshape(-1, 4) if r else np.zeros((0, 4), np.float32) for r in filled
    ]
    flat_boxes = np.concatenate(boxes) if boxes else np.zeros((0, 4), np.float32)
    box_arr = pa.ListArray.from_arrays(
        _offsets([len(b) for b in boxes]),
        pa.FixedSizeListArray.from_arrays(pa.array(flat_boxes.ravel(), pa.float32()), 4),
    )
    vectors = _nested_vectors([r.vectors if r else [] for r in filled], dtype)
    labels = pa.array([list(r.labels) if r else [] for r in filled], pa.list_(pa.string()))
    scores = pa.array(
        [None if (r is None or r.scores is None) else np.asarray(r.scores, np.float32) for r in filled],
        pa.list_(pa.float32()),
    )
    mask = pa.array([r is None for r in regs], pa.bool_()) if len(present) < len(regs) else None
    return pa.StructArray.from_arrays([box_arr, vectors, labels, scores], fields=list(rtype), mask=mask)


def documents_to_table(docs: Sequence[Document], feature_dtype: str = "float32") -> pa.Table:
    """Columnar conversion: feature vectors go into Arrow as flat buffers, not Python floats.

    Equivalent to ``pa.Table.from_pylist`` of one dict per document (a test checks it against
    that row-by-row oracle) but tens of times faster for thousands of 1280-d vectors.
    """
    schema = document_schema(feature_dtype)
    images = [im for d in docs for im in d.images]
    dtype = FEATURE_DTYPES[feature_dtype]
    image_arr = pa.StructArray.from_arrays(
        [
            pa.array([im.content_id for im in images], pa.string()),
            pa.array([im.uri for im in images], pa.string()),
            pa.array([im.width for im in images], pa.int32()),
            pa.array([im.height for im in images], pa.int32()),
            pa.array([None if im.phash is None else int(im.phash) for im in images], pa.uint64()),
            _vectors([im.features for im in images], dtype),
            _regions(images, feature_dtype),
        ],
        fields=list(image_type(feature_dtype)),
    )
    columns = {
        "doc_id": pa.array([d.doc_id for d in docs], pa.string()),
        "source": pa.array([d.source for d in docs], pa.string()),
        "split": pa.array([d.split for d in docs], pa.string()),
        "sentences": pa.array([list(d.sentences) for d in docs], pa.list_(pa.string())),
        "images": pa.ListArray.from_arrays(_offsets([len(d.images) for d in docs]), image_arr),
        "links": pa.array(
            [None if d.links is None else [{"sentence": s, "image": i} for s, i in d.links] for d in docs],
            schema.field("links").type,
        ),
        "metadata": pa.array([sorted(d.metadata.items()) for d in docs], schema.field("metadata").type),
    }
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)


def row_group_rows(table: pa.Table) -> int:
    """Rows per row group: at most ROW_GROUP_ROWS, and about ROW_GROUP_BYTES of data each."""
    if table.num_rows == 0:
        return ROW_GROUP_ROWS
    per_row = max(1, table.nbytes // table.num_rows)
    return int(max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES // per_row)))


def shard_bytes(docs: Iterable[Document], feature_dtype: str = "float32") -> bytes:
    """Serialise documents, in the given order, to the bytes of one Parquet shard.

    The caller fixes the order (sorted doc ids), so equal inputs give byte-identical files.
    """
    return table_shard_bytes(documents_to_table(list(docs), feature_dtype), feature_dtype)


def table_shard_bytes(table: pa.Table, feature_dtype: str = "float32") -> bytes:
    """A table in the logical layout (``document_schema``, rows in their final order) -> the
    bytes of one Parquet shard of the current schema version (features stored as bytes)."""
    table = encode_features(table, feature_dtype).replace_schema_metadata(
        document_schema(feature_dtype).metadata
    )
    paths = parquet_leaf_paths(table.schema)
    buf = io.BytesIO()
    pq.write_table(
        table,
        buf,
        row_group_size=row_group_rows(table),
        compression={p: FEATURES_CODEC if p == FEATURES_COLUMN else OTHER_CODEC for p in paths},
        use_dictionary=[p for p in paths if p != FEATURES_COLUMN],
    )
    return buf.getvalue()


def parquet_leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet column paths of ``schema``'s leaves, as ``ColumnChunkMetaData.path_in_schema``
    names them (``images.list.element.features.list.element``): per-column writer options need
    every one of them (a column a codec dict leaves out is written uncompressed)."""

    def walk(t: pa.DataType, path: str) -> Iterable[str]:
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            yield from walk(t.value_type, f"{path}.list.element")
        elif pa.types.is_map(t):
            yield from walk(t.key_type, f"{path}.key_value.key")
            yield from walk(t.item_type, f"{path}.key_value.value")
        elif pa.types.is_struct(t):
            for i in range(t.num_fields):
                yield from walk(t.field(i).type, f"{path}.{t.field(i).name}")
        else:
            yield path

    return [p for f in schema for p in walk(f.type, f.name)]


def write_shard(
    path: str | Path, docs: Iterable[Document], feature_dtype: str = "float32"
) -> tuple[int, int, str]:
    """Write one local shard atomically; returns (rows, bytes, sha256)."""
    docs = list(docs)
    data = shard_bytes(docs, feature_dtype)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)  # atomic: a crashed build never leaves a half-written shard behind
    return len(docs), len(data), hashlib.sha256(data).hexdigest()


def read_table(paths: Iterable[str | Path], columns: list[str] | None = None) -> pa.Table:
    """Read shards after checking each one's schema version (see ``check_shards``), in the
    logical layout (``document_schema``: features as ``list<float>``, ``decode_features``)."""
    tables = []
    for p in paths:
        check_shards([p])
        try:
            tables.append(decode_features(pq.read_table(p, columns=columns)))
        except (OSError, pa.ArrowInvalid, MmlinksError) as exc:  # the last: damaged feature bytes
            raise MmlinksError(f"cannot read shard {p}: {exc}") from exc
    if not tables:
        return document_schema().empty_table() if columns is None else pa.table({})
    return pa.concat_tables(tables)


def iter_tables(
    paths: Iterable[str | Path], batch_rows: int, columns: list[str] | None = None
) -> Iterator[pa.Table]:
    """``read_table``'s rows, ``batch_rows`` at a time, shard by shard in file order: what a
    reader of a whole split uses when the split need not fit in memory (the test split of a
    large corpus), since only one batch is decoded at a time. Same checks, same layout."""
    for p in paths:
        check_shards([p])
        try:
            shard = pq.ParquetFile(p)
            meta = shard.schema_arrow.metadata  # the stored feature dtype; a record batch lacks it
            for rb in shard.iter_batches(batch_size=batch_rows, columns=columns):
                yield decode_features(pa.Table.from_batches([rb]).replace_schema_metadata(meta))
        except (OSError, pa.ArrowInvalid, MmlinksError) as exc:  # the last: damaged feature bytes
            raise MmlinksError(f"cannot read shard {p}: {exc}") from exc


def count_rows(paths: Iterable[str | Path]) -> int:
    """How many documents these shards hold, from their footers (no column is read); the same
    checks as ``read_table``."""
    total = 0
    for p in paths:
        check_shards([p])
        try:
            total += pq.ParquetFile(p).metadata.num_rows
        except (OSError, pa.ArrowInvalid) as exc:
            raise MmlinksError(f"cannot read shard {p}: {exc}") from exc
    return total


def nonempty(table: pa.Table) -> pa.ChunkedArray:
    """Which rows are documents with at least one sentence and one image (the ones training
    reads: ``training.epoch_batches.drop_empty`` and the fixed validation batches)."""
    keep = pc.and_(
        pc.greater(pc.list_value_length(table.column("sentences")), 0),
        pc.greater(pc.list_value_length(table.column("images")), 0),
    )
    return pc.fill_null(keep, False)


LABEL_SCAN_ROWS = 4096  # rows of links read at a time by ``has_labels``


def has_labels(paths: Iterable[str | Path]) -> bool:
    """Whether any document of these shards has ground-truth links to score against."""

    # batch by batch, stopping at the first labelled one: a split's links are never all in
    # memory as Python objects (one list per document)
    for table in iter_tables(paths, LABEL_SCAN_ROWS, ["links"]):
        if pc.max(pc.fill_null(pc.list_value_length(table.column("links")), 0)).as_py() or 0:
            return True
    return False


def read_documents(paths: Iterable[str | Path]) -> list[Document]:
    return [Document.from_row(r) for r in read_table(paths).to_pylist()]
