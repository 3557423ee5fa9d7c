"""The dataset build: raw source -> validated, deduplicated, filtered documents -> features -> shards.

Stages (all Beam, so the same graph runs on the direct runner here and Dataflow/Flink there):

1. read the source; load every image through the content-addressed image store (fetched and
   decoded once, ever) and drop what is unusable;
2. drop documents that reuse a document id, then near-duplicates (pigeonhole phash search);
3. the paper's per-source filters, then the split (hash of the doc id, or fixed sizes);
4. features for each distinct image still needed: from the feature cache when present, else
   RunInference (model loaded once per worker, batched), written back to the cache;
5. join features back, group by (split, bucket), write size-bounded shards sorted by doc id.

Every drop is a Beam counter ``kind:reason`` plus a dead-letter record. The output is versioned:
shards go to ``OUT/versions/<dataset_version>/`` and ``OUT/manifest.json`` is written last, so a
reader sees the old version or the new one, never a mix, and an interrupted build changes nothing
a reader can see. All paths go through Beam FileSystems, so OUT may be a ``gs://``/``s3://`` URI.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field

import apache_beam as beam
import numpy as np
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import RunInference

from features import Extractor, ImageFeatures, get_extractor, resolve_device
from features.images import decode
from features.registry import DEFAULT_EXTRACTOR
from pipelines import fileio
from pipelines.dedupe import FindDuplicateDocuments
from pipelines.feature_cache import FeatureCache, cache_key
from pipelines.filters import DocumentFilter, filter_for
from pipelines.image_store import ImageStore, Placeholders
from pipelines.inference import model_handler
from pipelines.records import (
    COUNTS_NAMESPACE,
    DEAD_LETTER,
    DROPPED_NAMESPACE,
    DeadLetter,
    count,
    dead_letter,
)
from pipelines.runners import canonical_runner, pipeline_options
from pipelines.sources import SourceContext, SourceSpec, get_spec, source_outputs
from pipelines.splits import DEFAULT_RATIOS, assign_split, shard_index, sized_assignment, split_rank_key
from pipelines.validate import LoadAndValidate
from schemas.document import FEATURE_DTYPES, SCHEMA_VERSION, Document, ImageRecord, RegionFeatures
from schemas.errors import MmlinksError
from schemas.manifest import MANIFEST_NAME, FeatureExtractorInfo, Manifest, ShardInfo
from schemas.shards import shard_bytes

VERSIONS_DIR = "versions"
DEAD_LETTER_FILE = "dead_letter.jsonl"
SHARD_INDEX_FILE = "shards.jsonl"
OWNER_FILE = "owner.json"
BUILD_LOG = "build-log.jsonl"
# How this run got its inputs (store hits, cache hits) is not part of the dataset: these counters
# go to the build log, so a rebuild from a warm store writes the identical manifest.
RUN_COUNTERS = ("images_fetched", "images_from_store", "features_cached", "features_computed")


# Options given as KEY=VALUE maps: what the user says is laid over the source's defaults.
MERGED_OPTIONS = ("filter_options", "source_options", "extractor_options", "region_options")


@dataclass
class BuildConfig:
    source: str
    input: str
    out: str
    extractor: str = DEFAULT_EXTRACTOR  # a global extractor of features.registry
    regions: str | None = None  # a region extractor of features.registry, or none
    extractor_options: dict[str, str] = field(default_factory=dict)  # e.g. weights=PATH
    region_options: dict[str, str] = field(default_factory=dict)  # e.g. grid=6, num_regions=36
    precision: str = "float32"  # storage dtype of feature vectors: float32 | float16
    split_ratios: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RATIOS))
    split_sizes: dict[str, int] | None = None  # fixed-size splits (rest -> train) instead of ratios
    dedupe_threshold: int | None = 3  # Hamming distance; None switches near-duplicate removal off
    dedupe_policy: str = "drop_all"  # drop_all | keep_first
    filter_preset: str | None = None  # default: the source's preset (see pipelines.filters)
    filter_options: dict[str, str] = field(default_factory=dict)
    max_shard_rows: int = 1000
    max_shard_mb: float = 256.0
    image_store: str | None = None  # default OUT/image-store
    placeholder_images: str | None = None  # folder of example "image removed" pictures to reject
    placeholder_distance: int = 2  # phash bits within which an image counts as such a placeholder
    runner: str = "DirectRunner"
    direct_workers: int | None = None  # DirectRunner processes; None: one per CPU core, 1: in-process
    device: str = "cpu"
    cpu_threads: int | None = None  # torch threads per worker; default: this machine's cores / workers
    batch_size: int = 32
    beam_args: list[str] = field(default_factory=list)
    source_options: dict[str, str] = field(default_factory=dict)  # --source-option KEY=VALUE
    crawl_state: str | None = None  # the source's crawl state (default OUT/crawl-state/<source>)

    @classmethod
    def for_source(cls, source: str, input: str, out: str, **explicit) -> BuildConfig:
        """A config with the source's own defaults (filter preset, dedupe, split ratios) under
        the options the user gave explicitly (pass only those; None counts as not given)."""
        values = copy.deepcopy(get_spec(source).build_defaults)
        for key, value in explicit.items():
            if value is None:
                continue
            if key in MERGED_OPTIONS and isinstance(values.get(key), dict):
                values[key] = {**values[key], **value}  # e.g. --filter-option on the source's rules
            else:
                values[key] = value
        return cls(source=source, input=input, out=out, **values)

    def spec(self) -> SourceSpec:
        return get_spec(self.source)

    def crawl_state_root(self) -> str:
        return self.crawl_state or fileio.join(self.out, "crawl-state", self.source)

    def source_context(self) -> SourceContext:
        return self.spec().context(self.input, self.source_options, self.crawl_state_root())

    def document_filter(self) -> DocumentFilter:
        return filter_for(self.source, self.filter_preset, self.filter_options)

    def store_root(self) -> str:
        return self.image_store or fileio.join(self.out, "image-store")

    def params(self) -> dict:
        """Parameters that define the dataset version (paths, runner and batching do not)."""
        p = asdict(self)
        for k in (
            "input",
            "out",
            "runner",
            "beam_args",
            "batch_size",
            "image_store",
            "direct_workers",
            "crawl_state",
        ):
            p.pop(k)
        # Politeness, caches and endpoints do not change the documents; credentials never get here.
        p["source_options"] = self.spec().data_options(self.source_options)
        ph = self.placeholders()
        p["placeholder_images"] = None if ph is None else _placeholder_digest(ph)
        for k in ("extractor_options", "region_options"):  # weight paths are named by the versions
            p[k] = {name: v for name, v in sorted(p[k].items()) if name != "weights"}
        p["device"] = "cuda" if self.device.startswith("cuda") else "cpu"  # kernels differ in the last bits
        p["cpu_threads"] = self.threads()  # so do CPU reductions split over a different thread count
        p["filter"] = self.document_filter().params()
        return p

    def check(self) -> None:
        spec = self.spec()
        ctx = self.source_context()  # unknown source options fail here
        if spec.check is not None:
            spec.check(ctx)
        if self.precision not in FEATURE_DTYPES:
            raise MmlinksError(f"--precision must be one of {sorted(FEATURE_DTYPES)}, not {self.precision!r}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise MmlinksError("--cpu-threads must be >= 1")
        if self.max_shard_rows < 1 or self.max_shard_mb <= 0:
            raise MmlinksError("--max-shard-rows must be >= 1 and --max-shard-mb > 0")
        if self.dedupe_policy not in ("drop_all", "keep_first"):
            raise MmlinksError(f"--dedupe-policy must be drop_all or keep_first, not {self.dedupe_policy!r}")
        if self.dedupe_threshold is not None and not 0 <= self.dedupe_threshold <= 16:
            raise MmlinksError("--dedupe-threshold must be between 0 and 16 bits")
        if self.split_sizes is not None:
            if any(n < 0 for n in self.split_sizes.values()):
                raise MmlinksError(f"split sizes must be non-negative: {self.split_sizes}")
        elif (
            not self.split_ratios
            or any(v < 0 for v in self.split_ratios.values())
            or not sum(self.split_ratios.values())
        ):
            raise MmlinksError(f"split ratios must be non-negative with a positive sum: {self.split_ratios}")
        self.document_filter()
        resolve_device(self.device)
        ext = get_extractor(self.extractor, **self.extractor_options)
        if ext.kind != "global":
            raise MmlinksError(f"--extractor must be a global (CNN) extractor; {ext.name} gives regions")
        if self.regions:
            reg = get_extractor(self.regions, **self.region_options)
            if reg.kind != "regions":
                raise MmlinksError(f"--regions must be a region extractor; {reg.name} is global")
        self.pipeline_options()

    def threads(self) -> int | None:
        """Torch intra-op threads per worker process (None on GPU).

        CPU results change in the last bits with the thread count, so it is fixed per build and
        recorded with the dataset: the same inputs, parameters and thread count give the same
        bytes on any machine of the same architecture.
        """
        if self.device.startswith("cuda"):
            return None
        if self.cpu_threads:
            return self.cpu_threads
        workers = self.workers()
        if workers is None:
            return None  # a cluster runner: the workers' own default (say --cpu-threads to pin it)
        return max(1, (os.cpu_count() or 1) // workers)

    def workers(self) -> int | None:
        """DirectRunner worker processes (None for cluster runners)."""
        if canonical_runner(self.runner) != "DirectRunner":
            return None
        return self.direct_workers or (os.cpu_count() or 1)

    def placeholders(self) -> Placeholders | None:
        if not self.placeholder_images:
            return None
        return Placeholders.from_dir(self.placeholder_images, self.placeholder_distance)

    def pipeline_options(self):
        return pipeline_options(self.runner, self.beam_args, direct_workers=self.workers())


def _placeholder_digest(ph: Placeholders) -> str:
    """The placeholder set as part of the dataset's identity (it decides which images survive)."""
    text = json.dumps([sorted(ph.sha256s), sorted(ph.phashes), ph.max_distance])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- documents: ids, near-duplicates, filters, splits -------------------------------------------


def _unique_doc_ids(kv):
    doc_id, docs = kv
    docs = list(docs)
    if len(docs) == 1:
        yield docs[0]
        return
    for _ in docs:
        yield dead_letter("document", doc_id, "duplicate_doc_id", f"{len(docs)} documents share this id")


def _drop_duplicates(kv):
    doc_id, grouped = kv
    verdicts = list(grouped["verdict"])
    for doc in grouped["doc"]:
        if verdicts:
            v = verdicts[0]
            yield dead_letter(
                "document",
                doc_id,
                "near_duplicate",
                f"an image is within {v.distance} bits of an image of {v.duplicate_of}",
            )
        else:
            yield doc


class ApplyFilter(beam.DoFn):
    def __init__(self, rules: DocumentFilter):
        self.rules = rules

    def process(self, doc: dict):
        kept, rule, links_cut = self.rules.apply(doc)
        if kept is None:
            yield dead_letter("document", doc["doc_id"], f"filter_{rule}")
            return
        if links_cut:
            count("links_cut_with_sentences", links_cut)
        yield kept


def _with_split(doc: dict, ratios: dict[str, float], sized: dict[str, str] | None):
    if doc["split"]:  # the source defines its own splits (VIST, RecipeQA)
        return doc
    if sized is not None:
        return {**doc, "split": sized.get(doc["doc_id"], "train")}
    return {**doc, "split": assign_split(doc["doc_id"], ratios)}


# --- features ---------------------------------------------------------------------------------


class LookUpFeatureCache(beam.DoFn):
    """content id -> (content id, ImageFeatures) on a hit; the id on the ``miss`` output."""

    MISS = "miss"

    def __init__(self, store_root: str, key: str):
        self.store_root, self.key = store_root, key

    def setup(self):
        self.cache = FeatureCache(self.store_root, self.key)

    def process(self, content_id: str):
        feats = self.cache.get(content_id)
        if feats is None:
            yield beam.pvalue.TaggedOutput(self.MISS, content_id)
        else:
            count("features_cached")
            yield content_id, feats


class LoadPixels(beam.DoFn):
    """content id -> ((content id, (width, height)), model input), from the stored bytes.

    The original size rides in the key: region extractors report boxes in original pixels.
    """

    def __init__(self, store_root: str, extractor: Extractor):
        self.store_root, self.extractor = store_root, extractor

    def setup(self):
        self.store = ImageStore(self.store_root)

    def process(self, content_id: str):
        img = decode(self.store.get_bytes(content_id))
        yield (content_id, img.size), self.extractor.preprocess(img)


class StoreFeatures(beam.DoFn):
    def __init__(self, store_root: str, key: str, extractor: Extractor):
        self.store_root, self.key, self.extractor = store_root, key, extractor

    def setup(self):
        self.cache = FeatureCache(self.store_root, self.key)

    def process(self, kv):
        (content_id, size), result = kv
        feats = self.extractor.postprocess(result.inference, size)
        self.cache.put(content_id, feats)
        count("features_computed")
        yield content_id, feats


def _failed_batch(batch_and_error):
    batch, error = batch_and_error
    for (content_id, _size), _ in batch:
        beam.metrics.Metrics.counter(DROPPED_NAMESPACE, "image:inference_failed").inc()
        yield DeadLetter("image", content_id, "inference_failed", repr(error)[:500])


def _features(content_ids, cfg: BuildConfig, extractor: Extractor, label: str):
    """Distinct content ids -> (content id, ImageFeatures), plus dead letters of failed batches."""
    key = cache_key(
        extractor.name, extractor.version, cfg.device, {**extractor.options, "threads": cfg.threads()}
    )
    store_root = cfg.store_root()
    looked = content_ids | f"{label}Cache" >> beam.ParDo(LookUpFeatureCache(store_root, key)).with_outputs(
        LookUpFeatureCache.MISS, main="hit"
    )
    # Detectors forward one image at a time: big batches would only hold memory.
    batch = cfg.batch_size if extractor.forward_chunk else min(cfg.batch_size, 4)
    handler = model_handler(extractor, device=cfg.device, batch_size=batch, cpu_threads=cfg.threads())
    inferred, failed = (
        looked[LookUpFeatureCache.MISS]
        | f"{label}Pixels" >> beam.ParDo(LoadPixels(store_root, extractor))
        | f"{label}Inference" >> RunInference(handler).with_exception_handling()
    )
    computed = inferred | f"{label}Store" >> beam.ParDo(StoreFeatures(store_root, key, extractor))
    feats = (looked.hit, computed) | f"{label}All" >> beam.Flatten()
    dead = failed.failed_inferences | f"{label}Failed" >> beam.FlatMap(_failed_batch)
    return feats, dead


def _fan_out(kv, tag: str):
    """(content id, {feat: [f], ref: [doc ids]}) -> (doc id, (tag, content id, f)) per reference."""
    content_id, grouped = kv
    feats = list(grouped["feat"])
    for doc_id in grouped["ref"]:
        yield doc_id, (tag, content_id, feats[0] if feats else None)


def _region_record(feats: ImageFeatures | None) -> RegionFeatures | None:
    if feats is None or feats.regions is None:
        return None
    r = feats.regions
    return RegionFeatures(
        boxes=np.asarray(r["boxes"], np.float32).reshape(-1, 4),
        vectors=np.asarray(r["vectors"]),
        labels=list(r["labels"]),
        scores=np.asarray(r["scores"], np.float32),
    )


def _assemble(kv, with_regions: bool):
    doc_id, grouped = kv
    for doc in grouped["doc"]:  # exactly one: ids were made unique upstream
        got = {(tag, cid): f for tag, cid, f in grouped["feat"]}
        missing = [
            im["uri"]
            for im in doc["images"]
            if got.get(("cnn", im["content_id"])) is None
            or (with_regions and got.get(("regions", im["content_id"])) is None)
        ]
        if missing:  # each failed image is already dead-lettered once, by content id
            yield dead_letter("document", doc_id, "feature_extraction_failed", ", ".join(missing))
            continue
        images = [
            ImageRecord(
                features=got[("cnn", im["content_id"])].features,
                regions=_region_record(got.get(("regions", im["content_id"]))),
                **im,
            )
            for im in doc["images"]
        ]
        count(f"documents_out:{doc['split']}")
        yield Document(
            doc_id=doc_id,
            source=doc["source"],
            split=doc["split"],
            sentences=doc["sentences"],
            images=images,
            links=doc["links"],
            metadata=doc["metadata"],
        )


# --- shards -----------------------------------------------------------------------------------


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


# --- the graph --------------------------------------------------------------------------------


def build_pipeline(p: beam.Pipeline, cfg: BuildConfig, staging: str) -> None:
    extractor = get_extractor(cfg.extractor, **cfg.extractor_options)
    region_extractor = get_extractor(cfg.regions, **cfg.region_options) if cfg.regions else None
    store_root = cfg.store_root()

    spec, ctx = cfg.spec(), cfg.source_context()
    raw_docs, raw_dead = source_outputs(p | "Read" >> spec.make(ctx))
    fetcher = spec.fetcher(ctx) if spec.fetcher is not None else None
    checked = raw_docs | "Validate" >> beam.ParDo(
        LoadAndValidate(store_root, cfg.placeholders(), fetcher)
    ).with_outputs(DEAD_LETTER, main="docs")
    unique = (
        checked.docs
        | "KeyById" >> beam.Map(lambda d: (d["doc_id"], d))
        | "GroupById" >> beam.GroupByKey()
        | "UniqueIds" >> beam.FlatMap(_unique_doc_ids).with_outputs(DEAD_LETTER, main="docs")
    )
    docs = unique.docs
    dead = [raw_dead, checked[DEAD_LETTER], unique[DEAD_LETTER]]
    if cfg.dedupe_threshold is not None:
        verdicts = docs | "FindDuplicates" >> FindDuplicateDocuments(
            threshold=cfg.dedupe_threshold, policy=cfg.dedupe_policy
        )
        deduped = (
            {
                "doc": docs | "KeyForDedupe" >> beam.Map(lambda d: (d["doc_id"], d)),
                "verdict": verdicts | "KeyVerdicts" >> beam.Map(lambda v: (v.doc_id, v)),
            }
            | "JoinVerdicts" >> beam.CoGroupByKey()
            | "DropDuplicates" >> beam.FlatMap(_drop_duplicates).with_outputs(DEAD_LETTER, main="docs")
        )
        docs = deduped.docs
        dead.append(deduped[DEAD_LETTER])
    filtered = docs | "Filter" >> beam.ParDo(ApplyFilter(cfg.document_filter())).with_outputs(
        DEAD_LETTER, main="docs"
    )
    dead.append(filtered[DEAD_LETTER])
    sized = None
    if cfg.split_sizes is not None:
        total = sum(cfg.split_sizes.values())
        sized = beam.pvalue.AsSingleton(
            filtered.docs
            | "Unsplit" >> beam.Filter(lambda d: not d["split"])
            | "RankKey" >> beam.Map(lambda d: split_rank_key(d["doc_id"]))
            | "FirstByRank" >> beam.combiners.Top.Smallest(max(total, 1))
            | "SizedSplits"
            >> beam.Map(lambda ranked: sized_assignment([i for _, i in ranked], cfg.split_sizes))
        )
    split_docs = filtered.docs | "Split" >> beam.Map(_with_split, cfg.split_ratios, sized)

    refs = split_docs | "ImageRefs" >> beam.FlatMap(
        lambda d: [(im["content_id"], d["doc_id"]) for im in d["images"]]
    )
    needed = refs | "ImageIds" >> beam.Keys() | "DistinctImages" >> beam.Distinct()
    feature_sets = [("cnn", extractor)] + ([("regions", region_extractor)] if region_extractor else [])
    doc_feats = []
    for tag, ext in feature_sets:
        label = "CNN" if tag == "cnn" else "Regions"
        feats, failed = _features(needed, cfg, ext, label)
        dead.append(failed)
        doc_feats.append(
            {"feat": feats, "ref": refs}
            | f"{label}Join" >> beam.CoGroupByKey()
            | f"{label}FanOut" >> beam.FlatMap(_fan_out, tag)
        )
    all_feats = tuple(doc_feats) | "AllFeatures" >> beam.Flatten()
    assembled = (
        {"doc": split_docs | "KeyDocs" >> beam.Map(lambda d: (d["doc_id"], d)), "feat": all_feats}
        | "JoinDocs" >> beam.CoGroupByKey()
        | "Assemble"
        >> beam.FlatMap(_assemble, region_extractor is not None).with_outputs(DEAD_LETTER, main="docs")
    )
    dead.append(assembled[DEAD_LETTER])

    write_outputs(assembled.docs, dead, cfg, staging)


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


def _counters(result, namespace: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value)
    return dict(sorted(out.items()))


def _extractor_info(ext: Extractor) -> FeatureExtractorInfo:
    return FeatureExtractorInfo(ext.name, ext.version, ext.dim)


def build_dataset(cfg: BuildConfig) -> Manifest:
    """Run the build; write ``OUT/versions/<version>/`` and then ``OUT/manifest.json``.

    The manifest is the commit point, written last: until it is replaced, readers keep reading
    the previous version. Rebuilding the same inputs with the same parameters reproduces the same
    version (byte-identical shards, same manifest), and the image store and feature cache make
    the rerun cheap, so an interrupted build is resumed by running it again.
    """
    cfg.check()  # every option error before any folder is created
    options = cfg.pipeline_options()
    started = time.time()
    spec = cfg.spec()
    if spec.prebuilt is not None:  # features come with the source (the authors' prebuilt datasets)
        feature_info, region_info = spec.prebuilt.extractor_info(cfg.source_context())
    else:
        extractor = get_extractor(cfg.extractor, **cfg.extractor_options)
        region_extractor = get_extractor(cfg.regions, **cfg.region_options) if cfg.regions else None
        feature_info = _extractor_info(extractor)
        region_info = _extractor_info(region_extractor) if region_extractor else None
    out = cfg.out
    if "://" not in out:
        from pathlib import Path

        if Path(out).exists() and not Path(out).is_dir():
            raise MmlinksError(f"{out} exists and is not a directory")
    fileio.mkdirs(out)
    _remove_abandoned_staging(out)
    staging = fileio.join(out, f".staging-{uuid.uuid4().hex[:8]}")
    fileio.mkdirs(fileio.join(staging, "shards"))
    fileio.write_bytes_atomic(fileio.join(staging, OWNER_FILE), json.dumps(_owner()).encode())
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    try:
        with beam.Pipeline(options=options) as p:
            if spec.prebuilt is not None:
                docs, dead = spec.prebuilt.documents(p, cfg.source_context())
                write_outputs(docs, [dead], cfg, staging)
            else:
                build_pipeline(p, cfg, staging)
        result = p.result
        index = fileio.read_bytes(fileio.join(staging, SHARD_INDEX_FILE)).decode()
        shards = sorted(
            (ShardInfo(**json.loads(line)) for line in index.splitlines() if line.strip()),
            key=lambda s: s.path,
        )
        params = cfg.params()
        version = Manifest.version_id(shards, params)
        vdir = f"{VERSIONS_DIR}/{version}"
        splits = {s: 0 for s in (cfg.split_sizes or cfg.split_ratios)}
        splits.setdefault("train", 0)
        for s in shards:
            splits[s.split] = splits.get(s.split, 0) + s.rows
        pipeline_counts = _counters(result, COUNTS_NAMESPACE)
        run_counts = {k: pipeline_counts.pop(k) for k in RUN_COUNTERS if k in pipeline_counts}
        manifest = Manifest(
            schema_version=SCHEMA_VERSION,
            dataset_version=version,
            source=cfg.source,
            counts={
                "pipeline": pipeline_counts,
                "dropped": _counters(result, DROPPED_NAMESPACE),
                "splits": splits,
            },
            feature_extractor=feature_info,
            region_extractor=region_info,
            feature_dtype=cfg.precision,
            shards=[ShardInfo(f"{vdir}/{s.path}", s.split, s.rows, s.bytes, s.sha256) for s in shards],
            build_params=params,
            dead_letter=f"{vdir}/{DEAD_LETTER_FILE}",
        )
        target = fileio.join(out, vdir)
        fileio.delete_tree(target)  # a same-version leftover (e.g. an interrupted earlier commit)
        fileio.mkdirs(target)
        for s in shards:
            fileio.rename(fileio.join(staging, "shards", s.path), fileio.join(target, s.path))
        fileio.rename(fileio.join(staging, DEAD_LETTER_FILE), fileio.join(target, DEAD_LETTER_FILE))
        fileio.write_bytes_atomic(fileio.join(target, MANIFEST_NAME), manifest.to_json().encode())
        previous = _current_version(out)
        fileio.write_bytes_atomic(fileio.join(out, MANIFEST_NAME), manifest.to_json().encode())  # commit
        _prune_versions(out, keep={version, previous} - {None})
        _append_build_log(out, version, run_counts, time.time() - started)
    finally:
        fileio.delete_tree(staging)
    return manifest


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _remove_abandoned_staging(out: str) -> None:
    """Delete staging folders of builds on this host whose process is gone (killed builds).

    Folders of live builds, and of builds on other hosts, are left alone: two builds may share
    an output directory without destroying each other's work.
    """
    me = socket.gethostname()
    for uri in fileio.list_files(fileio.join(out, ".staging-*", OWNER_FILE)):
        try:
            owner = json.loads(fileio.read_bytes(uri))
            if owner["host"] != me:
                continue
            os.kill(int(owner["pid"]), 0)
        except ProcessLookupError:
            fileio.delete_tree(fileio.parent(uri))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge (permission, torn file)


def _append_build_log(out: str, version: str, run_counts: dict, seconds: float) -> None:
    entry = {"finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dataset_version": version}
    entry.update(seconds=round(seconds, 1), **{k: run_counts.get(k, 0) for k in RUN_COUNTERS})
    uri = fileio.join(out, BUILD_LOG)
    old = fileio.read_bytes(uri) if fileio.exists(uri) else b""
    fileio.write_bytes_atomic(uri, old + (json.dumps(entry, sort_keys=True) + "\n").encode())


def last_build(out: str) -> dict:
    """The build log's newest entry: how the last build got its images and features."""
    uri = fileio.join(out, BUILD_LOG)
    lines = fileio.read_bytes(uri).decode().splitlines() if fileio.exists(uri) else []
    return json.loads(lines[-1]) if lines else {}


def _current_version(out: str) -> str | None:
    uri = fileio.join(out, MANIFEST_NAME)
    if not fileio.exists(uri):
        return None
    try:
        return str(json.loads(fileio.read_bytes(uri))["dataset_version"])
    except (ValueError, KeyError, TypeError):
        return None  # unreadable: nothing to keep for it


def _prune_versions(out: str, keep: set[str]) -> None:
    """Delete version folders other than ``keep`` (the new one and the one it replaced)."""
    for uri in fileio.list_files(fileio.join(out, VERSIONS_DIR, "*", MANIFEST_NAME)):
        v = uri.rstrip("/").split("/")[-2]
        if v not in keep:
            fileio.delete_tree(fileio.join(out, VERSIONS_DIR, v))


def dead_letters(dataset_dir: str) -> list[dict]:
    manifest = Manifest.read(dataset_dir)
    if not manifest.dead_letter:
        return []
    text = fileio.read_bytes(fileio.join(str(dataset_dir), manifest.dead_letter)).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
