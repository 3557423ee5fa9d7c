"""Explicit upgrade of a dataset written by an older schema version (``mmlinks data migrate``).

Readers refuse old shards rather than guess; this rewrites them in the current layout as a new
dataset version next to the old one and then switches the manifest, so the old files stay
readable by old code until the next build prunes them.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.document import META_NAME_KEY, META_VERSION_KEY, SCHEMA_NAME, SCHEMA_VERSION, Document
from schemas.errors import MmlinksError
from schemas.feature_bytes import shard_feature_dtype
from schemas.manifest import MANIFEST_NAME, Manifest, ShardInfo
from schemas.shards import documents_to_table, table_shard_bytes

VERSIONS_DIR = "versions"
MIGRATES_FROM = (1, 2)


def _old_table(path: Path, version: int) -> pa.Table:
    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    if meta.get(META_NAME_KEY) != SCHEMA_NAME.encode():
        raise MmlinksError(f"{path} is not an mmlinks document shard")
    found = meta.get(META_VERSION_KEY, b"?").decode()
    if found != str(version):
        raise MmlinksError(f"{path} has schema version {found}; its manifest says {version}")
    return table


def upgraded_shard(path: Path, version: int) -> tuple[int, bytes]:
    """An old shard -> (rows, the bytes of the same documents in the current layout)."""
    table = _old_table(path, version)
    if version == 1:
        # v1 -> v2: regions gain ``scores`` (unknown for old data: null); the rest maps one to one.
        docs = [Document.from_row(row) for row in table.to_pylist()]
        return len(docs), table_shard_bytes(documents_to_table(docs))
    # v2 -> v3: the same columns; the writer stores each feature vector as bytes
    dtype = shard_feature_dtype(table.schema)
    return table.num_rows, table_shard_bytes(table, dtype)


def migrate_dataset(directory: str | Path) -> tuple[Manifest, bool]:
    """Upgrade ``directory`` in place; returns (manifest, whether anything was rewritten)."""
    directory = Path(directory)
    old = Manifest.read(directory, allow_older=True)
    if old.schema_version == SCHEMA_VERSION:
        return old, False
    if old.schema_version not in MIGRATES_FROM:
        raise MmlinksError(f"no migration from schema version {old.schema_version}")
    staging = directory / ".migrate-staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shards = []
    for info in old.shards:
        name = Path(info.path).name
        rows, data = upgraded_shard(directory / info.path, old.schema_version)
        (staging / name).write_bytes(data)
        shards.append(ShardInfo(name, info.split, rows, len(data), hashlib.sha256(data).hexdigest()))
    params = {
        **old.build_params,
        "migrated_from": {"schema_version": old.schema_version, "dataset_version": old.dataset_version},
    }
    version = Manifest.version_id(shards, params)
    vdir = f"{VERSIONS_DIR}/{version}"
    target = directory / vdir
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
    dead = None
    if old.dead_letter and (directory / old.dead_letter).exists():
        shutil.copyfile(directory / old.dead_letter, target / "dead_letter.jsonl")
        dead = f"{vdir}/dead_letter.jsonl"
    new = replace(
        old,
        schema_version=SCHEMA_VERSION,
        dataset_version=version,
        shards=[replace(s, path=f"{vdir}/{s.path}") for s in shards],
        dead_letter=dead,
        build_params=params,
    )
    (target / MANIFEST_NAME).write_text(new.to_json())
    tmp = directory / (MANIFEST_NAME + ".tmp")
    tmp.write_text(new.to_json())
    tmp.replace(directory / MANIFEST_NAME)
    return new, True
