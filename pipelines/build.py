"""The dataset build: raw source -> validated, deduplicated, filtered documents -> features -> shards
(docs/design.md walks the stages).

Why all Beam: the same graph runs on the direct runner here and Dataflow/Flink there. Why the
manifest is written last: a reader sees the old version or the new one, never a mix. This module
runs the parts in order: ``build_config``, ``graph``, ``feature_steps``, ``shards_writer``,
``commit``."""

from __future__ import annotations

import logging
import re
import time

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter

from features import Extractor, get_extractor
from pipelines import commit, fileio
from pipelines.build_config import BuildConfig
from pipelines.graph import build_pipeline
from pipelines.local_cluster import runner_cluster
from pipelines.records import COUNTS_NAMESPACE, DROPPED_NAMESPACE
from pipelines.shards_writer import write_outputs
from pipelines.sources import SourceSpec
from schemas.document import SCHEMA_VERSION
from schemas.errors import MmlinksError, exception_chain, storage_full
from schemas.manifest import FeatureExtractorInfo, Manifest, ShardInfo

SHOWN_COUNTS = 12  # counters named in the one-line "kept no document" error, largest first


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
    extractors = _extractor_infos(cfg, spec)
    staging = commit.open_staging(cfg.out)
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    try:
        with runner_cluster(options, cfg.workers()) as options, beam.Pipeline(options=options) as p:
            if spec.prebuilt is not None:
                docs, dead = spec.prebuilt.documents(p, cfg.source_context())
                write_outputs(docs, [dead], cfg, staging)
            else:
                build_pipeline(p, cfg, staging)
        shards = commit.read_shard_index(staging)
        commit.sort_dead_letters(staging)
        manifest, run_counts = _manifest(cfg, shards, p.result, *extractors)
        if not cfg.allow_empty and not any(s.rows for s in shards):
            raise MmlinksError(empty_build_message(cfg, manifest))
        commit.commit_version(cfg.out, staging, manifest, shards)
    except Exception as exc:
        reason = storage_full(exc)
        if reason is not None:
            raise MmlinksError(
                f"the build ran out of space writing {cfg.out} ({reason}); {_what_stays(cfg.out)}; "
                "free space (or build into another --out) and run it again: images and features "
                "already done are kept in the image store"
            ) from exc
        unreachable = scheduler_unreachable(exc)
        if unreachable is not None:
            raise MmlinksError(
                f"the Dask scheduler cannot be reached ({unreachable}); {_what_stays(cfg.out)}; "
                "start it or correct --dask-address, then run the same build again"
            ) from exc
        lost = worker_lost(exc)
        if lost is None:
            raise
        raise MmlinksError(
            f"a Beam worker process died during the build ({lost}); {_what_stays(cfg.out)}; "
            "run the same build again: images and features already done are kept"
        ) from exc
    finally:
        fileio.delete_tree(staging)
    try:
        commit.append_build_log(cfg.out, manifest.dataset_version, run_counts, time.time() - started)
    except OSError as exc:  # the version is committed; the log only says how it was built
        logging.getLogger(__name__).warning("build log not written: %s", exc)
    return manifest


# How the runner reports a worker process that vanished (SIGKILL, OOM killer): the multi-process
# DirectRunner's data channel closes under the driver (``RuntimeError: Channel closed
# prematurely.``, what tests/faults/test_build_worker_kill.py sees), or a gRPC call to the worker
# fails with UNAVAILABLE because its peer is gone. dask.distributed re-runs a dead worker's tasks
# elsewhere and gives up on a task whose workers all died (``KilledWorker: Attempted to run task
# ... on 3 different workers, but all those workers died while running it``; allowed-failures).
# The gRPC words are matched only inside gRPC's own rendering of an error (``status =
# StatusCode.UNAVAILABLE`` then ``details = "..."``): a bare "Connection reset by peer" is as
# likely a source's HTTP fetch (requests' ConnectionResetError, the polite client's
# ``retries_exhausted``), which must surface as itself, not as a lost worker.
_WORKER_LOST = re.compile(
    r"Channel closed prematurely"
    r"|on \d+ different workers, but all those workers died"
    r'|StatusCode\.UNAVAILABLE\s+details = "[^"]*?(?:Socket closed|Connection reset by peer)'
)


def worker_lost(exc: BaseException) -> str | None:
    """The runner's words when ``exc`` or its cause says a worker process died, else None."""
    for e in exception_chain(exc):
        if found := _WORKER_LOST.search(str(e)):
            words = found.group(0)
            if words.startswith("StatusCode"):  # the gRPC details, one line
                words = "gRPC UNAVAILABLE: " + words.split('details = "', 1)[1]
            return f"{type(e).__name__}: {words}"
    return None


# dask.distributed's words for a scheduler it cannot reach (the client's connect timeout) or lost.
_NO_SCHEDULER = re.compile(
    r"Timed out trying to connect to \S+ after [\d.]+ s"
    r"|[Uu]nable to connect to (?:the )?scheduler[^\n]*"
    r"|scheduler-connection-lost"
)


def scheduler_unreachable(exc: BaseException) -> str | None:
    """dask.distributed's words when ``exc`` or its cause says the scheduler is unreachable or
    was lost, else None."""
    for e in exception_chain(exc):
        if found := _NO_SCHEDULER.search(str(e)):
            return f"{type(e).__name__}: {found.group(0)}"
    return None


def _what_stays(out: str) -> str:
    current = commit.current_manifest(out)
    if current is None:
        return "nothing was committed"
    rows = sum(s.rows for s in current.shards)
    return f"the current version {current.dataset_version} ({rows} documents) stays"


def empty_build_message(cfg: BuildConfig, manifest: Manifest) -> str:
    """One line: what a build that kept no document read, why everything went, what stays current.

    Counters are the pipeline's own (``reddit_files_read``, ``posts_filtered_subreddit``, ...)
    and the drops by ``kind:reason``, largest first; the dead letters are not committed, so the
    line is all the user gets, and it must say where to look.
    """
    counts = {**manifest.counts["pipeline"], **manifest.counts["dropped"]}
    shown = sorted(((v, k) for k, v in counts.items() if v), reverse=True)[:SHOWN_COUNTS]
    what = ", ".join(f"{k}={v}" for v, k in shown) or "no counter moved: the source yielded nothing"
    if len(counts) > SHOWN_COUNTS:
        what += ", ..."
    stays = _what_stays(cfg.out)
    return (
        f"the {cfg.source} build of {cfg.input} kept no document ({what}); {stays}; "
        "check --input and --source, or pass --allow-empty to commit an empty version"
    )


def _extractor_infos(
    cfg: BuildConfig, spec: SourceSpec
) -> tuple[FeatureExtractorInfo, FeatureExtractorInfo | None]:
    if spec.prebuilt is not None:  # features come with the source (the authors' prebuilt datasets)
        return spec.prebuilt.extractor_info(cfg.source_context())
    extractor = get_extractor(cfg.extractor, **cfg.extractor_options)
    region_extractor = get_extractor(cfg.regions, **cfg.region_options) if cfg.region_extractor() else None
    return _extractor_info(extractor), (_extractor_info(region_extractor) if region_extractor else None)


def _extractor_info(ext: Extractor) -> FeatureExtractorInfo:
    return FeatureExtractorInfo(ext.name, ext.version, ext.dim)


def _manifest(
    cfg: BuildConfig,
    shards: list[ShardInfo],
    result,
    feature_info: FeatureExtractorInfo,
    region_info: FeatureExtractorInfo | None,
) -> tuple[Manifest, dict[str, int]]:
    """The new version's manifest, and the run counters that go to the build log instead."""
    spec = cfg.spec()
    params = cfg.params()
    version = Manifest.version_id(shards, params)
    vdir = commit.version_dir(version)
    splits = {s: 0 for s in (cfg.split_sizes or cfg.split_ratios)}
    splits.setdefault("train", 0)
    for s in shards:
        splits[s.split] = splits.get(s.split, 0) + s.rows
    pipeline_counts = _counters(result, COUNTS_NAMESPACE)
    run_counts = {k: pipeline_counts.pop(k) for k in commit.RUN_COUNTERS if k in pipeline_counts}
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
        dead_letter=f"{vdir}/{commit.DEAD_LETTER_FILE}",
        relations=spec.relations(cfg.source_context()) if spec.relations is not None else None,
    )
    return manifest, run_counts


def _counters(result, namespace: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value)
    return dict(sorted(out.items()))
