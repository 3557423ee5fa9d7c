"""Reading and writing document shards, with the schema-version check every reader needs."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.document import (
    META_NAME_KEY,
    META_VERSION_KEY,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    Document,
    document_schema,
)
from schemas.errors import MmlinksError

ROW_GROUP_ROWS = 256


def check_schema(schema: pa.Schema, where: str | Path) -> None:
    """Refuse shards that are not mmlinks shards or come from an unknown schema version."""
    meta = schema.metadata or {}
    if meta.get(META_NAME_KEY) != SCHEMA_NAME.encode():
        raise MmlinksError(f"{where} is not an mmlinks document shard (no schema name metadata)")
    raw = meta.get(META_VERSION_KEY, b"?").decode()
    if raw != str(SCHEMA_VERSION):
        raise MmlinksError(
            f"{where} has document schema version {raw}; this mmlinks reads version "
            f"{SCHEMA_VERSION} (upgrade mmlinks or rebuild the dataset)"
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


def write_shard(path: str | Path, docs: Iterable[Document]) -> tuple[int, int, str]:
    """Write documents in the given order; returns (rows, bytes, sha256).

    The caller fixes the order (sorted doc ids), so equal inputs give byte-identical files.
    """
    rows = [d.to_row() for d in docs]
    table = pa.Table.from_pylist(rows, schema=document_schema())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    pq.write_table(table, tmp, row_group_size=ROW_GROUP_ROWS, compression="zstd")
    tmp.replace(path)  # atomic: a crashed build never leaves a half-written shard behind
    data = path.read_bytes()
    return len(rows), len(data), hashlib.sha256(data).hexdigest()


def read_table(paths: Iterable[str | Path], columns: list[str] | None = None) -> pa.Table:
    """Read shards after checking each one's schema version (see ``check_shards``)."""
    tables = []
    for p in paths:
        check_shards([p])
        try:
            tables.append(pq.read_table(p, columns=columns))
        except (OSError, pa.ArrowInvalid) as exc:
            raise MmlinksError(f"cannot read shard {p}: {exc}") from exc
    if not tables:
        return document_schema().empty_table() if columns is None else pa.table({})
    return pa.concat_tables(tables)


def read_documents(paths: Iterable[str | Path]) -> list[Document]:
    return [Document.from_row(r) for r in read_table(paths).to_pylist()]
