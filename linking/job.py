"""The batch-linking job: resolve and check the model, run the Beam graph, commit the links
(docs/design.md, "Batch linking").

Everything that can refuse the job does so before any folder is created; the same inputs, model
and options give byte-identical shards (``pipelines/commit.py``'s protocol)."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter

from linking.config import ALL_SPLITS, LinkConfig
from linking.graph import EVAL_FILE, link_pipeline
from linking.model import ResolvedModel, check_model_fits, load_linker_at, load_scorer, resolve_model
from pipelines import commit, fileio
from pipelines.local_cluster import runner_cluster
from pipelines.records import COUNTS_NAMESPACE, DROPPED_NAMESPACE
from schemas.errors import MmlinksError
from schemas.links import LINKS_SCHEMA_VERSION, LinkManifest
from schemas.manifest import FeatureExtractorInfo, Manifest, ShardInfo


@dataclass
class LinkResult:
    manifest: LinkManifest
    out: str
    seconds: float

    def summary(self) -> dict:
        """What ``mmlinks link --json`` prints and the Dagster asset records."""
        m = self.manifest
        c = m.counts
        return {
            "manifest": fileio.join(self.out, "manifest.json"),
            "link_version": m.link_version,
            "model": {
                "uri": m.model.uri,
                "name": m.model.name,
                "version": m.model.version,
                "run_id": m.model.run_id,
            },
            "dataset_version": m.dataset_version,
            "feature_extractor": f"{m.feature_extractor.name}@{m.feature_extractor.version}",
            **{k: c[k] for k in ("documents_read", "documents_linked", "documents_dead_lettered", "images")},
            "images_linked": c["images_linked"],
            "link_rate": c["link_rate"],
            "dead_letter_rate": c["dead_letter_rate"],
            "dropped": c["dropped"],
            "shards": len(m.shards),
            "dead_letter": fileio.join(self.out, m.dead_letter) if m.dead_letter else None,
            "evaluation": m.evaluation,
            "seconds": round(self.seconds, 2),
            "docs_per_s": round(c["documents_linked"] / self.seconds, 1) if self.seconds else None,
        }


def link_documents(cfg: LinkConfig) -> LinkResult:
    """Run the link job of ``cfg``; returns the committed manifest and the wall time."""
    from features import resolve_device
    from training.tracking import tracking_uri

    started = time.time()
    resolve_device(cfg.device)  # --device cuda without a GPU: one line, before anything
    uri = cfg.tracking_uri or tracking_uri(cfg.workdir)
    model = resolve_model(cfg.model, uri)
    job = {"load_uri": model.load_uri, "tracking_uri": uri}
    if cfg.data is not None:
        manifest = Manifest.read(cfg.data)
        job["shards"] = _shards(cfg, manifest)
        # every shard against its manifest (size, sha256) before the graph: a flipped byte would
        # otherwise be linked as the version the manifest names, and a truncated or missing one
        # would surface as a worker's traceback; this is the check the other readers make
        manifest.shard_paths(cfg.data, None if cfg.split == ALL_SPLITS else cfg.split)
    else:
        manifest, job["build"] = _raw_input(cfg, model, uri)
    check_model_fits(model, manifest)
    job["dim"] = _check_width(model, uri, manifest, cfg.device)
    options = cfg.pipeline_options()
    made_out = not fileio.exists(cfg.out)
    staging = commit.open_staging(cfg.out)
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    try:
        try:
            with runner_cluster(options, cfg.workers()) as options, beam.Pipeline(options=options) as p:
                link_pipeline(p, cfg, job, staging)
        except Exception as exc:
            _runner_failure(exc)
            raise
        counts = _counts(p.result)
        if counts["documents_read"] == 0:
            where = cfg.data if cfg.data is not None else cfg.input
            raise MmlinksError(f"read no documents from {where}: nothing to link")
        shards = _shard_index(staging)
        evaluation = _evaluation(staging) if cfg.eval else None
        links = _manifest(cfg, model, manifest, shards, counts, evaluation)
        commit.commit_files(cfg.out, staging, links.link_version, [s.path for s in shards], links.to_json())
    except BaseException:
        fileio.delete_tree(staging)
        if made_out and not fileio.list_files(cfg.out, include_temp=True):
            fileio.delete_tree(cfg.out)  # a failed job leaves no empty output folder it made
        raise
    fileio.delete_tree(staging)
    return LinkResult(links, cfg.out, time.time() - started)


def _runner_failure(exc: BaseException) -> None:
    """A lost worker or an unreachable Dask scheduler as one line (nothing was committed)."""
    from pipelines.build import scheduler_unreachable, worker_lost

    unreachable = scheduler_unreachable(exc)
    if unreachable is not None:
        raise MmlinksError(
            f"the Dask scheduler cannot be reached ({unreachable}); nothing was committed; start it "
            "or correct --dask-address, then run the same link job again"
        ) from exc
    lost = worker_lost(exc)
    if lost is not None:
        raise MmlinksError(
            f"a Beam worker process died during the link job ({lost}); nothing was committed; "
            "run the same link job again"
        ) from exc


def _shards(cfg: LinkConfig, manifest: Manifest) -> list[tuple[str, str]]:
    chosen = [s for s in manifest.shards if cfg.split in (ALL_SPLITS, s.split)]
    if not chosen:
        raise MmlinksError(f"{cfg.data} has no {cfg.split!r} shards: nothing to link")
    return [(s.path, s.path.rsplit("/", 1)[-1]) for s in chosen]


def _raw_input(cfg: LinkConfig, model: ResolvedModel, tracking_uri: str):
    """--input: the build config whose stages read and featurise the raw documents with the
    extractor the model was trained on (its recorded name, options such as a CLIP architecture,
    and weights, checked against the recorded version), and a manifest standing for the data."""
    from mlflow.exceptions import MlflowException

    from features import get_extractor
    from models.packaging import served_extractor_options
    from pipelines.build_config import BuildConfig
    from schemas.document import SCHEMA_VERSION

    images = getattr(load_linker_at(model.load_uri, tracking_uri), "images", None)
    if images is None or not images.name:
        raise MmlinksError(f"{model.info.uri} names no feature extractor; link a built dataset with --data")
    try:
        recorded = (images.name, images.version, images.options, images.weights)
        extractor_options = served_extractor_options(*recorded)
    except MlflowException as exc:  # the serving path's 400: here a one-line refusal before any work
        raise MmlinksError(f"cannot featurise raw documents for {model.info.uri}: {exc.message}") from None
    options = {
        "extractor": images.name,
        "extractor_options": extractor_options,
        "runner": cfg.runner,
        "device": cfg.device,
        "beam_args": list(cfg.beam_args),
    }
    options.update(
        {
            k: getattr(cfg, k)
            for k in ("direct_workers", "dask_address", "dask_workers", "cpu_threads", "image_store")
            if getattr(cfg, k)
        }
    )
    build = BuildConfig.for_source(cfg.source, cfg.input, cfg.out, **options)
    build.check()
    ext = get_extractor(images.name, **extractor_options)
    info = FeatureExtractorInfo(ext.name, ext.version, ext.dim)
    manifest = Manifest(SCHEMA_VERSION, "raw", cfg.source, {}, info, [], {"input": cfg.input})
    return manifest, build


def _check_width(model: ResolvedModel, uri: str, manifest: Manifest, device: str) -> int:
    """Load the model once here: it must load, and take the data's feature width."""
    scorer = load_scorer(model.load_uri, uri, device)
    dim = manifest.feature_extractor.dim
    if scorer.image_dim != dim:
        raise MmlinksError(
            f"{model.info.uri} takes {scorer.image_dim}-d image features, but the data has {dim}-d "
            f"{manifest.feature_extractor.name} features"
        )
    return dim


def _counts(result) -> dict:
    def query(namespace: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]:
            value = c.committed if c.committed is not None else c.attempted
            out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value)
        return dict(sorted(out.items()))

    counts = query(COUNTS_NAMESPACE)
    dropped = query(DROPPED_NAMESPACE)
    read, linked = counts.get("documents_read", 0), counts.get("documents_linked", 0)
    images, images_linked = counts.get("images", 0), counts.get("images_linked", 0)
    dead_docs = sum(v for k, v in dropped.items() if k.startswith("document:"))
    return {
        "documents_read": read,
        "documents_linked": linked,
        "documents_dead_lettered": dead_docs,
        "images": images,
        "images_linked": images_linked,
        "link_rate": round(images_linked / images, 6) if images else 0.0,
        "dead_letter_rate": round(dead_docs / (linked + dead_docs), 6) if linked + dead_docs else 0.0,
        "dropped": dropped,
        "pipeline": {
            k: v
            for k, v in counts.items()
            if k not in ("documents_read", "documents_linked", "images", "images_linked")
        },
    }


def _shard_index(staging: str) -> list[ShardInfo]:
    if not fileio.exists(fileio.join(staging, commit.SHARD_INDEX_FILE)):
        return []
    return commit.read_shard_index(staging)


def _evaluation(staging: str) -> dict:
    """Link P/R/F1 and the per-document score metrics: the one line of totals the job combined
    (``linking.steps.EvalTotals``); no labelled document wrote none."""
    from linking.steps import EvalTotals

    path = fileio.join(staging, EVAL_FILE)
    lines = fileio.read_bytes(path).decode().splitlines() if fileio.exists(path) else []
    totals = [json.loads(x) for x in lines if x.strip()]
    fn = EvalTotals()
    return _finite(totals[0] if totals else fn.extract_output(fn.create_accumulator()))


def _finite(value):
    """NaN (an undefined metric) as null: manifests are strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _manifest(cfg, model, manifest, shards, counts, evaluation) -> LinkManifest:
    identity = {
        **cfg.identity(),
        "model": model.info.__dict__ | {"uri": None},  # the version, not the alias, defines the links
        "dataset_version": manifest.dataset_version,
    }
    version = LinkManifest.version_id(shards, identity)
    vdir = commit.version_dir(version)
    return LinkManifest(
        schema_version=LINKS_SCHEMA_VERSION,
        link_version=version,
        dataset_version=manifest.dataset_version,
        dataset_source=manifest.source,
        feature_extractor=manifest.feature_extractor,
        model=model.info,
        params=cfg.identity(),
        counts=counts,
        shards=[ShardInfo(f"{vdir}/{s.path}", s.split, s.rows, s.bytes, s.sha256) for s in shards],
        dead_letter=f"{vdir}/{commit.DEAD_LETTER_FILE}",
        evaluation=evaluation,
    )
