"""The features stage of the build: each distinct image's features, then features joined back.

Cache hits are reused; misses go through ``RunInference`` and back into the cache. A failed
batch dead-letters its images, and a document missing any image's features is dead-lettered once."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import RunInference

from features import Extractor, ImageFeatures
from pipelines import fault_hooks
from pipelines.build_config import BuildConfig
from pipelines.feature_cache import FeatureCache, cache_key
from pipelines.inference import stored_image_handler
from pipelines.records import DEAD_LETTER, DROPPED_NAMESPACE, DeadLetter, count, dead_letter
from schemas.document import Document, ImageRecord, RegionFeatures


@dataclass(frozen=True)
class Failure:
    """Why an image has no features (the exception of its failed batch); it travels in place of
    the features so the document's dead letter can say it."""

    error: str


class LookUpFeatureCache(beam.DoFn):
    """content id -> (content id, ImageFeatures) on a hit; the id on the ``miss`` output.

    Entries this build (``build``) wrote itself are misses, so a re-run of a lost bundle splits
    its ids as the first run did (``pipelines/feature_cache.py``)."""

    MISS = "miss"

    def __init__(self, store_root: str, key: str, build: str):
        self.store_root, self.key, self.build = store_root, key, build

    def setup(self):
        self.cache = FeatureCache(self.store_root, self.key)

    def process(self, content_id: str):
        feats = self.cache.get(content_id, unless_written_by=self.build)
        if feats is None:
            yield beam.pvalue.TaggedOutput(self.MISS, content_id)
        else:
            count("features_cached")
            yield content_id, feats


class StoreFeatures(beam.DoFn):
    """Computed features -> the cache (marked as this build's) and on to the documents."""

    def __init__(self, store_root: str, key: str, extractor: Extractor, build: str):
        self.store_root, self.key, self.extractor, self.build = store_root, key, extractor, build

    def setup(self):
        self.cache = FeatureCache(self.store_root, self.key)

    def process(self, result):
        content_id, size = result.example
        feats = self.extractor.postprocess(result.inference, size)
        self.cache.put(content_id, feats, written_by=self.build)
        fault_hooks.reached("features")
        count("features_computed")
        yield content_id, feats


def error_text(error) -> str:
    """``Type: message`` of a failed batch's error, as dead-letter details carry it.

    Beam's RunInference hands the error over as ``(type, repr, formatted traceback lines)``
    (the exception itself does not survive its coder); its traceback's last line is
    ``Type: message``."""
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    if isinstance(error, tuple) and len(error) == 3 and isinstance(error[2], list) and error[2]:
        return str(error[2][-1]).strip()
    if isinstance(error, tuple) and error and isinstance(error[0], type):
        return f"{error[0].__name__}: {error[1] if len(error) > 1 else ''}"
    return repr(error)


def _failed_batch(batch_and_error):
    batch, error = batch_and_error
    for content_id in batch:
        beam.metrics.Metrics.counter(DROPPED_NAMESPACE, "image:inference_failed").inc()
        yield DeadLetter("image", content_id, "inference_failed", error_text(error)[:500])


def _failed_ids(batch_and_error):
    """(content id, ``Type: message``) per image of a failed batch, joined back to its documents."""
    batch, error = batch_and_error
    for content_id in batch:
        yield content_id, Failure(error_text(error))


def image_features(content_ids, cfg: BuildConfig, extractor: Extractor, label: str):
    """Distinct content ids -> (content id, ImageFeatures | Failure), plus dead letters of failed
    batches (a Failure stands for an image whose batch failed, carrying the exception)."""
    shaping = {**extractor.options, "threads": cfg.threads()}
    if str(cfg.device).startswith("cuda"):  # a GPU forwards bigger chunks than older builds did
        shaping["forward_chunk"] = extractor.chunk_for(cfg.device)
    key = cache_key(extractor.name, extractor.version, cfg.device, shaping)
    store_root = cfg.store_root()
    build = uuid.uuid4().hex  # this run of the graph: its own cache entries are not hits
    looked = content_ids | f"{label}Cache" >> beam.ParDo(
        LookUpFeatureCache(store_root, key, build)
    ).with_outputs(LookUpFeatureCache.MISS, main="hit")
    # Detectors forward one image at a time: big batches would only hold memory.
    batch = cfg.batch_size if extractor.forward_chunk else min(cfg.batch_size, 4)
    # The handler reads the pixels itself: RunInference's inputs are ids any worker can take.
    handler = stored_image_handler(extractor, store_root, cfg.device, batch, cfg.threads())
    inferred, failed = (
        looked[LookUpFeatureCache.MISS]
        | f"{label}Inference" >> RunInference(handler).with_exception_handling()
    )
    computed = inferred | f"{label}Store" >> beam.ParDo(StoreFeatures(store_root, key, extractor, build))
    failures = failed.failed_inferences | f"{label}FailedIds" >> beam.FlatMap(_failed_ids)
    feats = (looked.hit, computed, failures) | f"{label}All" >> beam.Flatten()
    dead = failed.failed_inferences | f"{label}Failed" >> beam.FlatMap(_failed_batch)
    return feats, dead


def fan_out(kv, tag: str):
    """(content id, {feat: [f], ref: [doc ids]}) -> (doc id, (tag, content id, f)) per reference."""
    content_id, grouped = kv
    feats = sorted(grouped["feat"], key=lambda f: not isinstance(f, ImageFeatures))  # features first
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


def _missing_features(images: list[dict], got: dict, tags: tuple[str, ...]) -> str:
    """``"cnn: RuntimeError: ...: uri, uri"`` per (feature set, error) of the images that have no
    features; errors first, so the 500-character detail keeps them ("" when nothing is missing)."""
    by_error: dict[str, list[str]] = {}
    for im in images:
        for tag in tags:
            value = got.get((tag, im["content_id"]))
            if not isinstance(value, ImageFeatures):
                why = value.error if isinstance(value, Failure) else "no features and no recorded error"
                by_error.setdefault(f"{tag}: {why}", []).append(im["uri"])
    return "; ".join(f"{why}: {', '.join(uris)}" for why, uris in by_error.items())


def assemble(kv, with_regions: bool):
    doc_id, grouped = kv
    for doc in grouped["doc"]:  # exactly one: ids were made unique upstream
        got = {(tag, cid): f for tag, cid, f in grouped["feat"]}
        missing = _missing_features(doc["images"], got, ("cnn", "regions") if with_regions else ("cnn",))
        if missing:  # each failed image is also dead-lettered once, by content id
            yield dead_letter("document", doc_id, "feature_extraction_failed", missing)
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


def attach_features(split_docs, cfg: BuildConfig, extractor: Extractor, region_extractor: Extractor | None):
    """Split document dicts -> (Documents with features, [dead-letter PCollections])."""
    refs = split_docs | "ImageRefs" >> beam.FlatMap(
        lambda d: [(im["content_id"], d["doc_id"]) for im in d["images"]]
    )
    needed = refs | "ImageIds" >> beam.Keys() | "DistinctImages" >> beam.Distinct()
    feature_sets = [("cnn", extractor)] + ([("regions", region_extractor)] if region_extractor else [])
    dead, doc_feats = [], []
    for tag, ext in feature_sets:
        label = "CNN" if tag == "cnn" else "Regions"
        feats, failed = image_features(needed, cfg, ext, label)
        dead.append(failed)
        doc_feats.append(
            {"feat": feats, "ref": refs}
            | f"{label}Join" >> beam.CoGroupByKey()
            | f"{label}FanOut" >> beam.FlatMap(fan_out, tag)
        )
    all_feats = tuple(doc_feats) | "AllFeatures" >> beam.Flatten()
    assembled = (
        {"doc": split_docs | "KeyDocs" >> beam.Map(lambda d: (d["doc_id"], d)), "feat": all_feats}
        | "JoinDocs" >> beam.CoGroupByKey()
        | "Assemble"
        >> beam.FlatMap(assemble, region_extractor is not None).with_outputs(DEAD_LETTER, main="docs")
    )
    dead.append(assembled[DEAD_LETTER])
    return assembled.docs, dead
