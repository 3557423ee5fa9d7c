"""The dataset build: raw source -> validated documents -> CNN features -> Parquet shards.

Stages (all Beam, so the same graph runs on the direct runner here and Dataflow/Flink there):
read source -> load + validate images and sentences -> dedupe image bytes by content id ->
RunInference (model loaded once per worker, batched) -> join features back to documents ->
deterministic split -> group by (split, shard) -> write sorted shards. Dead letters from every
stage are flattened into one ``dead_letter.jsonl``; Beam counters feed the manifest.

Shards are written to a staging folder and swapped in only after the pipeline succeeded, so an
interrupted build leaves the previous dataset version intact.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import torch
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import RunInference
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.features.extractor import FeatureExtractor, get_extractor
from pipelines.images import decode
from pipelines.records import (
    COUNTS_NAMESPACE,
    DEAD_LETTER,
    DROPPED_NAMESPACE,
    DeadLetter,
    count,
    dead_letter,
)
from pipelines.sources import get_source
from pipelines.splits import DEFAULT_RATIOS, assign_split, shard_index
from pipelines.validate import IMAGE_BYTES, LoadAndValidate
from schemas.document import SCHEMA_VERSION, Document, ImageRecord
from schemas.errors import MmlinksError
from schemas.manifest import MANIFEST_NAME, FeatureExtractorInfo, Manifest, ShardInfo
from schemas.shards import write_shard

SHARDS_DIR = "shards"
DEAD_LETTER_FILE = "dead_letter.jsonl"


@dataclass
class BuildConfig:
    source: str
    input: str
    out: str
    extractor: str = "efficientnet-lite0"
    num_shards: int = 2  # per split
    split_ratios: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RATIOS))
    runner: str = "DirectRunner"
    device: str = "cpu"
    batch_size: int = 32
    beam_args: list[str] = field(default_factory=list)

    def params(self) -> dict:
        """Parameters that define the dataset version (paths and runner do not)."""
        p = asdict(self)
        for k in ("input", "out", "runner", "beam_args", "device", "batch_size"):
            p.pop(k)
        return p


def _preprocess(kv: tuple[str, bytes], extractor: FeatureExtractor):
    cid, data = kv
    return cid, torch.from_numpy(extractor.preprocess(decode(data)))


def _to_features(kv) -> tuple[str, list[float]]:
    cid, result = kv
    return cid, np.asarray(result.inference, dtype=np.float32).tolist()


def _failed_batch(batch_and_error):
    batch, error = batch_and_error
    for cid, _ in batch:
        beam.metrics.Metrics.counter(DROPPED_NAMESPACE, "image:inference_failed").inc()
        yield DeadLetter("image", cid, "inference_failed", repr(error)[:500])


def _fan_out_features(kv):
    """(content_id, {feat: [f], ref: [doc_ids]}) -> (doc_id, (content_id, f)) per reference."""
    cid, grouped = kv
    feats = list(grouped["feat"])
    for doc_id in grouped["ref"]:
        yield doc_id, (cid, feats[0] if feats else None)


class AssembleDocument(beam.DoFn):
    def __init__(self, ratios: dict[str, float]):
        self.ratios = ratios

    def process(self, kv):
        doc_id, grouped = kv
        docs = list(grouped["doc"])
        if len(docs) != 1:
            for _ in docs:
                yield dead_letter("document", doc_id, "duplicate_doc_id")
            return
        doc = docs[0]
        feats = {cid: f for cid, f in grouped["feat"]}
        missing = [im["uri"] for im in doc["images"] if feats.get(im["content_id"]) is None]
        if missing:  # each failed image is already dead-lettered once, by content id
            yield dead_letter("document", doc_id, "feature_extraction_failed", ", ".join(missing))
            return
        images = [ImageRecord(features=feats[im["content_id"]], regions=None, **im) for im in doc["images"]]
        split = doc["split"] or assign_split(doc_id, self.ratios)
        count(f"documents_out:{split}")
        yield Document(
            doc_id=doc_id,
            source=doc["source"],
            split=split,
            sentences=doc["sentences"],
            images=images,
            links=doc["links"],
            metadata=doc["metadata"],
        )


class WriteShard(beam.DoFn):
    def __init__(self, staging: str):
        self.staging = staging

    def process(self, kv):
        (split, index), docs = kv
        docs = sorted(docs, key=lambda d: d.doc_id)  # content-determined order
        path = Path(self.staging) / f"{split}-{index:05d}.parquet"
        rows, _, _ = write_shard(path, docs)
        yield path.name, rows


def build_pipeline(p: beam.Pipeline, cfg: BuildConfig, staging: str, dead_letter_prefix: str) -> None:
    extractor = get_extractor(cfg.extractor)
    read = p | "Read" >> get_source(cfg.source, cfg.input)
    checked = read.documents | "Validate" >> beam.ParDo(LoadAndValidate()).with_outputs(
        DEAD_LETTER, IMAGE_BYTES, main="docs"
    )
    handler = extractor.model_handler(cfg.device, max_batch=cfg.batch_size)
    inferred, failed = (
        checked[IMAGE_BYTES]
        | "DedupeImages" >> beam.CombinePerKey(lambda blobs: next(iter(blobs), b""))
        | "Preprocess" >> beam.Map(_preprocess, extractor)
        | "CNN" >> RunInference(handler).with_exception_handling()
    )
    features = inferred | "ToList" >> beam.Map(_to_features)
    # A batch that fails inference loses only its images (each dead-lettered); their documents
    # are then dead-lettered by AssembleDocument instead of crashing the build.
    inference_dead = failed.failed_inferences | "FailedInference" >> beam.FlatMap(_failed_batch)
    refs = checked.docs | "ImageRefs" >> beam.FlatMap(
        lambda d: [(im["content_id"], d["doc_id"]) for im in d["images"]]
    )
    doc_feats = (
        {"feat": features, "ref": refs}
        | "JoinFeatures" >> beam.CoGroupByKey()
        | "FanOut" >> beam.FlatMap(_fan_out_features)
    )
    assembled = (
        {"doc": checked.docs | "KeyDocs" >> beam.Map(lambda d: (d["doc_id"], d)), "feat": doc_feats}
        | "JoinDocs" >> beam.CoGroupByKey()
        | "Assemble" >> beam.ParDo(AssembleDocument(cfg.split_ratios)).with_outputs(DEAD_LETTER, main="docs")
    )
    _ = (
        assembled.docs
        | "ShardKey" >> beam.Map(lambda d: ((d.split, shard_index(d.doc_id, cfg.num_shards)), d))
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShard(staging))
    )
    _ = (
        (read[DEAD_LETTER], checked[DEAD_LETTER], inference_dead, assembled[DEAD_LETTER])
        | "AllDeadLetters" >> beam.Flatten()
        | "DeadLetterJson" >> beam.Map(lambda r: r.to_json())
        | "WriteDeadLetters" >> beam.io.WriteToText(dead_letter_prefix, shard_name_template="", num_shards=1)
    )


def _counters(result, namespace: str) -> dict[str, int]:
    out = {}
    for c in result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value)
    return dict(sorted(out.items()))


def _describe_shards(shard_dir: Path) -> list[ShardInfo]:
    shards = []
    for path in sorted(shard_dir.glob("*.parquet")):
        data = path.read_bytes()
        shards.append(
            ShardInfo(
                path=f"{SHARDS_DIR}/{path.name}",
                split=path.name.rsplit("-", 1)[0],
                rows=pq.ParquetFile(path).metadata.num_rows,
                bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
            )
        )
    return shards


def build_dataset(cfg: BuildConfig) -> Manifest:
    """Run the build and write ``OUT/shards/*.parquet``, ``dead_letter.jsonl`` and the manifest.

    Everything is produced in a staging folder first, manifest included; the previous version
    is replaced only after the pipeline succeeded, by a few renames (shards, dead letters, then
    the manifest last), so an interrupted build leaves the old version readable.
    """
    if cfg.num_shards < 1:
        raise MmlinksError("--num-shards must be >= 1")
    if (
        not cfg.split_ratios
        or any(v < 0 for v in cfg.split_ratios.values())
        or not sum(cfg.split_ratios.values())
    ):
        raise MmlinksError(f"split ratios must be non-negative with a positive sum: {cfg.split_ratios}")
    extractor = get_extractor(cfg.extractor)
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise MmlinksError(f"{out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    options = PipelineOptions([f"--runner={cfg.runner}", *cfg.beam_args], save_main_session=False)
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    try:
        with beam.Pipeline(options=options) as p:
            build_pipeline(p, cfg, str(staging / SHARDS_DIR), str(staging / DEAD_LETTER_FILE))
        result = p.result
        (staging / SHARDS_DIR).mkdir(exist_ok=True)  # a build with zero documents has no shards
        shards = _describe_shards(staging / SHARDS_DIR)
        splits = {s: 0 for s in cfg.split_ratios}
        for s in shards:
            splits[s.split] = splits.get(s.split, 0) + s.rows
        params = cfg.params()
        manifest = Manifest(
            schema_version=SCHEMA_VERSION,
            dataset_version=Manifest.version_id(shards, params),
            source=cfg.source,
            counts={
                "pipeline": _counters(result, COUNTS_NAMESPACE),
                "dropped": _counters(result, DROPPED_NAMESPACE),
                "splits": splits,
            },
            feature_extractor=FeatureExtractorInfo(extractor.name, extractor.version, extractor.dim),
            shards=shards,
            build_params=params,
            dead_letter=DEAD_LETTER_FILE,
        )
        manifest.write(staging)
        old = out / f".old-{uuid.uuid4().hex[:8]}"
        if (out / SHARDS_DIR).exists():
            (out / SHARDS_DIR).rename(old)
        (staging / SHARDS_DIR).rename(out / SHARDS_DIR)
        (staging / DEAD_LETTER_FILE).replace(out / DEAD_LETTER_FILE)
        (staging / MANIFEST_NAME).replace(out / MANIFEST_NAME)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def dead_letters(dataset_dir: str | Path) -> list[dict]:
    path = Path(dataset_dir) / DEAD_LETTER_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
