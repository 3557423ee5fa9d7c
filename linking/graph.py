"""The link job's Beam graph, top to bottom: row groups spread over workers -> documents in fixed
chunks -> RunInference (the link model, once per worker) -> predicted links -> link shards, dead
letters and evaluation records.

Documents come from a built dataset's shards, or from raw documents through the build's own
read/validate/features stages (``pipelines/graph.py``), so raw documents get exactly the
features the model was trained on. Step labels are stable names (runner UIs, metrics).
"""

from __future__ import annotations

import json
import math

import apache_beam as beam
from apache_beam.ml.inference.base import RunInference

from linking.config import LinkConfig
from linking.model import LinkModelHandler
from linking.steps import EVAL, LinkChunk, ReadChunks, WriteLinkShards, from_document, raw_chunks, row_groups
from linking.steps import write_sorted_lines as _write_sorted
from pipelines import fileio
from pipelines.commit import DEAD_LETTER_FILE, SHARD_INDEX_FILE
from pipelines.records import DEAD_LETTER

EVAL_FILE = "eval.jsonl"
RAW_ROWS_PER_SHARD = 1000  # --input: documents are hashed into ceil(n / this) output shards


def link_pipeline(p: beam.Pipeline, cfg: LinkConfig, job: dict, staging: str) -> None:
    """``job``: ``load_uri``, ``tracking_uri`` (the resolved model), ``dim`` (feature width),
    and for --data ``shards`` [(path, output name)] or for --input ``build`` (a BuildConfig)."""
    limits = (job["dim"], cfg.max_sentences, cfg.max_images)
    if cfg.data is not None:
        chunks, dead = dataset_chunks(p, cfg, job["shards"], limits)
    else:
        chunks, dead = raw_document_chunks(p, cfg, job["build"], limits)
    handler = LinkModelHandler(job["load_uri"], job["tracking_uri"], cfg.device, cfg.threads())
    linked = (
        chunks
        | "Score" >> RunInference(handler)
        | "Link"
        >> beam.ParDo(LinkChunk(cfg.assign, cfg.threshold(), cfg.keep_scores, cfg.eval)).with_outputs(
            EVAL, main="rows"
        )
    )
    write_links(linked.rows, staging)
    write_small(dead, "DeadLetters", lambda r: r.to_json(), fileio.join(staging, DEAD_LETTER_FILE))
    if cfg.eval:
        write_small(
            [linked[EVAL]],
            "Evaluation",
            lambda r: json.dumps(r, sort_keys=True),
            fileio.join(staging, EVAL_FILE),
        )


def dataset_chunks(p: beam.Pipeline, cfg: LinkConfig, shards: list[tuple[str, str]], limits):
    """Shards -> units of row groups (from their footers), spread over the workers, each read
    and cut into chunks where it is scored: only row-group names cross the shuffle, never
    features."""
    read = (
        p
        | "Shards" >> beam.Create(shards)
        | "RowGroups" >> beam.FlatMap(row_groups, cfg.data)
        | "Spread" >> beam.Reshuffle()
        | "ReadChunks"
        >> beam.ParDo(ReadChunks(cfg.data, cfg.batch_docs, limits, cfg.eval)).with_outputs(
            DEAD_LETTER, main="chunks"
        )
    )
    return read.chunks, [read[DEAD_LETTER]]


def raw_document_chunks(p: beam.Pipeline, cfg: LinkConfig, build, limits):
    """Raw documents through the build's stages (read, validate, unique ids, features), then
    hashed into buckets, each sorted by doc id and cut into chunks."""
    from features import get_extractor
    from pipelines.feature_steps import attach_features
    from pipelines.graph import assign_splits, keep_unique_ids, read_and_validate
    from pipelines.splits import shard_index

    docs, dead = read_and_validate(p, build)
    docs = keep_unique_ids(docs, dead)
    docs = assign_splits(docs, build)
    built, feature_dead = attach_features(
        docs, build, get_extractor(build.extractor, **build.extractor_options), None
    )
    total = beam.pvalue.AsSingleton(built | "CountDocs" >> beam.combiners.Count.Globally())
    chunks = (
        built
        | "ToDicts" >> beam.Map(from_document)
        | "Bucket"
        >> beam.Map(
            lambda d, n: (shard_index(d["doc_id"], max(1, math.ceil(n / RAW_ROWS_PER_SHARD))), d), total
        )
        | "GroupBuckets" >> beam.GroupByKey()
        | "RawChunks"
        >> beam.FlatMap(raw_chunks, cfg.batch_docs, limits).with_outputs(DEAD_LETTER, main="chunks")
    )
    return chunks.chunks | "Spread" >> beam.Reshuffle(), [*dead, *feature_dead, chunks[DEAD_LETTER]]


def write_links(rows, staging: str) -> None:
    _ = (
        rows
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteLinkShards(fileio.join(staging, "shards")))
        | "WriteShardIndex"
        >> beam.io.WriteToText(fileio.join(staging, SHARD_INDEX_FILE), shard_name_template="", num_shards=1)
    )


def write_small(pcolls: list, label: str, to_line, path: str) -> None:
    """Few records (dead letters, evaluation rows) -> one sorted JSONL file."""
    _ = (
        tuple(pcolls)
        | f"All{label}" >> beam.Flatten()
        | f"{label}Json" >> beam.Map(to_line)
        | f"{label}List" >> beam.combiners.ToList()
        | f"Write{label}" >> beam.Map(_write_sorted, path)
    )
