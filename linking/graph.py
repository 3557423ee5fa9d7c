"""The link job's Beam graph: row groups over workers -> fixed chunks of documents ->
RunInference -> predicted links -> link shards, dead letters and evaluation records.

Why raw documents go through the build's own stages (``pipelines/graph.py``): they get exactly
the features the model was trained on. Step labels are stable names (runner UIs, metrics)."""

from __future__ import annotations

import json
import math

import apache_beam as beam
from apache_beam.ml.inference.base import RunInference

from linking.config import LinkConfig
from linking.model import LinkModelHandler
from linking.steps import (
    EVAL,
    Chunk,
    EvalTotals,
    LinkChunk,
    ReadChunks,
    WriteLinkShards,
    from_document,
    raw_chunks,
    row_groups,
)
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
    small = {
        SHARD_INDEX_FILE: ([write_links(linked.rows, staging)], None),
        DEAD_LETTER_FILE: (dead, lambda r: r.to_json()),
    }
    if cfg.eval:  # totals combined by key (no global combine's default stage), one line
        totals = (
            linked[EVAL]
            | "EvalKey" >> beam.Map(lambda r: (EVAL, r))
            | "EvalTotals" >> beam.CombinePerKey(EvalTotals())
            | "EvalValues" >> beam.Values()
        )
        small[EVAL_FILE] = ([totals], lambda r: json.dumps(r, sort_keys=True))
    write_small(small, staging)


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
        >> beam.ParDo(ReadChunks(cfg.data, cfg.batch_docs, limits, cfg.eval))
        .with_output_types(Chunk)  # sized by ChunkCoder, not by pickling
        .with_outputs(DEAD_LETTER, main="chunks")
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
        >> beam.FlatMap(raw_chunks, cfg.batch_docs, limits)
        .with_output_types(Chunk)
        .with_outputs(DEAD_LETTER, main="chunks")
    )
    return chunks.chunks | "Spread" >> beam.Reshuffle(), [*dead, *feature_dead, chunks[DEAD_LETTER]]


def write_links(rows, staging: str):
    """Link rows -> one Parquet shard per output name; returns their ShardInfo JSON lines (the
    shard index, written with the other small outputs by ``write_small``)."""
    return (
        rows
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteLinkShards(fileio.join(staging, "shards")))
    )


def write_small(files: dict[str, tuple[list, object]], staging: str) -> None:
    """Few records per file (the shard index, dead letters, evaluation rows) -> one sorted JSONL
    file each in ``staging``, so reruns give the same bytes whatever order the runner produced
    them in. ``files``: file name -> (PCollections, record -> line, None when they are lines).

    All of them go through ONE list and one write: each stage after the scoring runs inside the
    job's steady-state window and costs its bundle set-up on the runner (a ``WriteToText`` and a
    list per file were six stages after the scoring; this is two). One key through a GroupByKey, not
    ``ToList``: a global combine adds a stage that injects its default through a side input, the
    costliest stage of the tail. Without any line there is no write (then no document was read and
    the job stops before it reads these files)."""
    tagged = []
    for name, (pcolls, to_line) in files.items():
        for k, pcoll in enumerate(pcolls):
            line = (lambda r: r) if to_line is None else to_line
            tagged.append(
                pcoll | f"Lines[{name}]{k}" >> beam.Map(lambda r, n=name, f=line: ("small", (n, f(r))))
            )
    _ = (
        tuple(tagged)
        | "AllSmallOutputs" >> beam.Flatten()
        | "SmallOutputsGroup" >> beam.GroupByKey()
        | "WriteSmallOutputs" >> beam.MapTuple(lambda _, lines: _write_files(lines, staging, sorted(files)))
    )


def _write_files(lines: list[tuple[str, str]], staging: str, names: list[str]) -> None:
    """(file name, line) pairs -> each named file, sorted; a name without lines: an empty file."""
    by_name: dict[str, list[str]] = {name: [] for name in names}
    for name, line in lines:
        by_name[name].append(line)
    for name, chosen in by_name.items():
        _write_sorted(chosen, fileio.join(staging, name))
