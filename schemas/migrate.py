"""Explicit upgrade of a dataset written by an older schema version (``mmlinks data migrate``).

Readers refuse old shards rather than guess; this rewrites them in the current layout as a new
dataset version next to the old one and then switches the manifest, so the old files stay
readable by old code until the next build prunes them.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq

from schemas.document import META_NAME_KEY, META_VERSION_KEY, SCHEMA_NAME, SCHEMA_VERSION, Document
from schemas.errors import MmlinksError
from schemas.manifest import MANIFEST_NAME, Manifest, ShardInfo
from schemas.shards import write_shard

VERSIONS_DIR = "versions"


def _v1_documents(path: Path) -> list[Document]:
    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    if meta.get(META_NAME_KEY) != SCHEMA_NAME.encode():
        raise MmlinksError(f"{path} is not an mmlinks document shard")
    version = meta.get(META_VERSION_KEY, b"?").decode()
    if version != "1":
        raise MmlinksError(f"{path} has schema version {version}; only version 1 can be migrated")
    # v1 -> v2: regions gain ``scores`` (unknown for old data: null); the rest maps one to one.
    return [Document.from_row(row) for row in table.to_pylist()]


def migrate_dataset(directory: str | Path) -> tuple[Manifest, bool]:
    """Upgrade ``directory`` in place; returns (manifest, whether anything was rewritten)."""
    directory = Path(directory)
    old = Manifest.read(directory, allow_older=True)
    if old.schema_version == SCHEMA_VERSION:
        return old, False
    if old.schema_version != 1:
        raise MmlinksError(f"no migration from schema version {old.schema_version}")
    staging = directory / ".migrate-staging"
    shutil.rmtree(staging, ignore_errors=True)
    shards = []
    for info in old.shards:
        name = Path(info.path).name
        rows, size, sha = write_shard(staging / name, _v1_documents(directory / info.path))
        shards.append(ShardInfo(name, info.split, rows, size, sha))
    params = {
        **old.build_params,
        "migrated_from": {"schema_version": 1, "dataset_version": old.dataset_version},
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
