"""Documents -> size-bounded Parquet shards in the staging folder, plus the shard index and the
dead-letter file. Why hashed buckets sorted by doc id: the same documents give the same shard
bytes whatever the runner did."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict

import apache_beam as beam
import numpy as np

from pipelines import fault_hooks, fileio
from pipelines.build_config import BuildConfig
from pipelines.commit import DEAD_LETTER_FILE, SHARD_INDEX_FILE
from pipelines.records import count
from pipelines.splits import shard_index
from schemas.document import Document
from schemas.manifest import ShardInfo
from schemas.shards import shard_bytes


def estimated_bytes(doc: Document) -> int:
    """Uncompressed size estimate of a document's row (feature vectors dominate)."""
    n = sum(len(s) for s in doc.sentences) + 64 * len(doc.images)
    for im in doc.images:
        if im.features is not None:
            n += np.asarray(im.features).nbytes
        if im.regions is not None:
            n += np.asarray(im.regions.vectors).nbytes + 16 * len(im.regions.labels)
    return n


def shard_parts(docs: list[Document], max_rows: int, max_bytes: float) -> list[list[Document]]:
    """Cut documents (already in their final order) into consecutive parts within both bounds."""
    parts: list[list[Document]] = [[]]
    size = 0
    for doc in docs:
        b = estimated_bytes(doc)
        if parts[-1] and (len(parts[-1]) >= max_rows or size + b > max_bytes):
            parts.append([])
            size = 0
        parts[-1].append(doc)
        size += b
    return [p for p in parts if p]


class WriteShards(beam.DoFn):
    """((split, bucket), documents) -> size-bounded Parquet shards; yields ShardInfo JSON lines."""

    def __init__(self, shard_dir: str, max_rows: int, max_bytes: float, precision: str):
        self.shard_dir, self.max_rows, self.max_bytes, self.precision = (
            shard_dir,
            max_rows,
            max_bytes,
            precision,
        )

    def process(self, kv):
        (split, bucket), docs = kv
        docs = sorted(docs, key=lambda d: d.doc_id)  # content-determined order
        for part, chunk in enumerate(shard_parts(docs, self.max_rows, self.max_bytes)):
            name = f"{split}-{bucket:05d}-{part:03d}.parquet"
            data = shard_bytes(chunk, self.precision)
            fileio.write_bytes_atomic(fileio.join(self.shard_dir, name), data)
            fault_hooks.reached("write")
            count("shards_written")
            info = ShardInfo(name, split, len(chunk), len(data), hashlib.sha256(data).hexdigest())
            yield json.dumps(asdict(info), sort_keys=True)


def _bucket_key(doc: Document, totals: dict, max_rows: int, max_bytes: float):
    n, size = totals.get(doc.split, (1, 0))
    buckets = max(1, math.ceil(n / max_rows), math.ceil(size / max_bytes))
    return (doc.split, shard_index(doc.doc_id, buckets)), doc


def _sum_pairs(pairs):
    n = b = 0
    for x, y in pairs:
        n, b = n + x, b + y
    return n, b


def write_outputs(docs, dead: list, cfg: BuildConfig, staging: str) -> None:
    """Documents -> size-bounded shards + the shard index; dead letters -> one JSONL file."""
    max_bytes = cfg.max_shard_mb * 1024 * 1024
    totals = beam.pvalue.AsDict(
        docs
        | "SizeBySplit" >> beam.Map(lambda d: (d.split, (1, estimated_bytes(d))))
        | "SplitTotals" >> beam.CombinePerKey(_sum_pairs)
    )
    _ = (
        docs
        | "ShardKey" >> beam.Map(_bucket_key, totals, cfg.max_shard_rows, max_bytes)
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShards"
        >> beam.ParDo(
            WriteShards(fileio.join(staging, "shards"), cfg.max_shard_rows, max_bytes, cfg.precision)
        )
        | "WriteShardIndex"
        >> beam.io.WriteToText(fileio.join(staging, SHARD_INDEX_FILE), shard_name_template="", num_shards=1)
    )
    _ = (
        tuple(dead)
        | "AllDeadLetters" >> beam.Flatten()
        | "DeadLetterJson" >> beam.Map(lambda r: r.to_json())
        | "WriteDeadLetters"
        >> beam.io.WriteToText(fileio.join(staging, DEAD_LETTER_FILE), shard_name_template="", num_shards=1)
    )
