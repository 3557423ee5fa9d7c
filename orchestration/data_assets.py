"""Raw snapshots and dataset versions: ``diy_submissions[month]`` ··> ``raw_snapshot[source]`` ->
``dataset[source]``. Each asset body is a function of its upstream values and resources that
calls the library (``pipelines.synthetic_corpus``, the Reddit crawl, ``pipelines.build``).
"""

import hashlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
from dagster import AssetExecutionContext

from orchestration.asset_support import DIY, SYNTHETIC, failures_explained, versioned
from orchestration.resources import RedditResource, StorageResource
from orchestration.settings import Settings
from schemas.config_fields import from_dict
from schemas.errors import MmlinksError


def data_assets(
    settings: Settings,
    sources: dg.StaticPartitionsDefinition,
    months: dg.MonthlyPartitionsDefinition,
    retry: dg.RetryPolicy,
) -> list[dg.AssetsDefinition]:
    @dg.asset(
        partitions_def=months,
        group_name="raw",
        kinds={"reddit"},
        retry_policy=retry,
        description="r/DIY submissions created in one month, under ROOT/raw/diy/<YYYY-MM>/: the month's "
        "dump (RS_YYYY-MM.zst from MMLINKS_DIY_DUMPS) copied in when there is one (historical months, "
        "backfills), else the incremental crawl of /r/DIY/new (the current month; weekly schedule).",
    )
    def diy_submissions(context: AssetExecutionContext, storage: StorageResource, reddit: RedditResource):
        return diy_month(context, storage, reddit)

    @dg.asset(
        partitions_def=sources,
        group_name="raw",
        deps=[dg.AssetDep(diy_submissions, partition_mapping=dg.AllPartitionMapping())],
        description="The raw input of one source, fingerprinted: the synthetic corpus is generated "
        "(mmlinks data synth); other sources are read where settings.raw_inputs or ROOT/raw/<source> "
        "says (for diy: the monthly folders diy_submissions fills).",
    )
    def raw_snapshot(context: AssetExecutionContext, storage: StorageResource) -> dg.Output[dict]:
        return snapshot_source(context.partition_key, settings, storage, log=context.log.info)

    @dg.asset(
        partitions_def=sources,
        group_name="datasets",
        kinds={"beam", "parquet"},
        retry_policy=retry,
        description="A dataset version built with Apache Beam (mmlinks data build): Parquet shards + "
        "manifest.json under ROOT/datasets/<source>; the manifest is the commit point.",
    )
    def dataset(
        context: AssetExecutionContext, raw_snapshot: dict, storage: StorageResource
    ) -> dg.Output[dict]:
        return build_source(context, settings, raw_snapshot, storage)

    return [diy_submissions, raw_snapshot, dataset]


def diy_month(context: AssetExecutionContext, storage: StorageResource, reddit: RedditResource) -> dict:
    """One month of r/DIY: the month's dump when there is one, else the incremental crawl."""
    from pipelines import fileio

    month = context.partition_key
    folder = fileio.join(storage.raw_uri(DIY), month)
    with failures_explained(f"r/DIY {month}"):
        dump = reddit.dump_for(month)
        if dump is not None:
            target = fileio.join(folder, dump.replace("\\", "/").rsplit("/", 1)[-1])
            meta = _copy_once(dump, target)
            meta.update(mode="dump", month=month, source_file=dump)
        else:
            current = datetime.now(UTC).strftime("%Y-%m")
            if month < current:
                raise MmlinksError(
                    f"no dump RS_{month}.zst under {reddit.dumps or '(MMLINKS_DIY_DUMPS unset)'}, and "
                    f"the Reddit listing reaches only recent posts: a past month comes from the dumps"
                )
            result = reddit.crawl(storage.raw_uri(DIY), storage.crawl_state_uri("reddit"))
            meta = {
                "mode": "crawl",
                "month": month,
                "new_posts": result.get("new_posts", 0),
                "files": result.get("files", []),
                "gap_possible": bool(result.get("gap_possible")),
            }
            if result.get("gap_possible"):
                context.log.warning(f"the crawl may have missed posts: {result.get('gap')}")
    context.add_output_metadata(
        {k: dg.MetadataValue.json(v) if isinstance(v, list | dict) else v for k, v in meta.items()}
    )
    return {"month": month, "folder": folder, **meta}


def snapshot_source(
    source: str, settings: Settings, storage: StorageResource, log: Callable[[str], None] = print
) -> dg.Output[dict]:
    """The raw input of ``source``, fingerprinted (the synthetic corpus is generated first).

    ``log`` gets progress lines: generating the demo's corpus takes about a minute, and a step
    that says nothing for a minute looks hung (issue #46)."""
    from pipelines import fileio

    extra: dict = {}
    with failures_explained(f"raw {source}"):
        if source == SYNTHETIC and source not in settings.raw_inputs:
            uri = storage.raw_path(source)
            extra = _synthetic_corpus(uri, settings.synthetic, log)
        else:
            uri = settings.raw_inputs.get(source) or storage.raw_uri(source)
            if fileio.is_local(uri) and not Path(uri).exists():
                raise MmlinksError(
                    f"no raw input for {source} at {uri}: put the source's files there or set "
                    f"raw_inputs.{source} in the Dagster settings"
                    + (" (or backfill diy_submissions months)" if source == DIY else "")
                )
            if source == DIY:
                from pipelines.sources.reddit import list_input_files

                if not list_input_files(uri):
                    raise MmlinksError(f"no r/DIY submission files under {uri}: backfill diy_submissions")
        log(f"raw {source}: fingerprinting {uri}")
        fp = _fingerprint(uri)
        log(f"raw {source}: {fp['files']} files, {fp['bytes']} bytes, fingerprint {fp['fingerprint']}")
    if fp["files"] == 0:
        raise dg.Failure(description=f"raw {source}: {uri} holds no files", allow_retries=False)
    snapshot = {"source": source, "uri": uri, **fp, **extra}
    return versioned(snapshot, fp["fingerprint"], {"uri": uri, **fp, **extra})


def build_source(
    context: AssetExecutionContext, settings: Settings, raw_snapshot: dict, storage: StorageResource
) -> dg.Output[dict]:
    """``mmlinks data build`` of the partition's source from its snapshot, with the build options."""
    from pipelines import fileio
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.commit import last_build
    from schemas.library_output import build_log_path, library_output_to

    source = context.partition_key
    with failures_explained(f"dataset {source}"):
        try:
            cfg = BuildConfig.for_source(
                source,
                raw_snapshot["uri"],
                storage.dataset_uri(source),
                **settings.build_config_options(source),
            )
        except TypeError as exc:
            raise MmlinksError(f"build_options for {source}: {exc}") from exc
        cfg.check()  # option errors as one line, before Beam starts
        log = build_log_path(cfg.out)  # Beam's workers print their harness INFO: there, as the CLI's
        context.log.info(f"building {source} with Beam ({cfg.runner}) -> {cfg.out} (Beam's log: {log})")
        with library_output_to(log):
            manifest = build_dataset(cfg)
    splits = manifest.counts.get("splits", {})
    dropped = manifest.counts.get("dropped", {})
    ref = {
        "source": source,
        "uri": cfg.out,
        "path": storage.dataset_path(source),
        "dataset_version": manifest.dataset_version,
        "schema_version": manifest.schema_version,
        "splits": splits,
        "feature_extractor": f"{manifest.feature_extractor.name}@{manifest.feature_extractor.version}",
        "feature_dim": manifest.feature_extractor.dim,
    }
    build = last_build(cfg.out)
    metadata = {
        "dataset_version": manifest.dataset_version,
        "schema_version": manifest.schema_version,
        "documents": sum(splits.values()),
        **{f"documents_{s}": n for s, n in splits.items()},
        "dropped": sum(dropped.values()),
        "dropped_by_reason": dg.MetadataValue.json(dropped),
        "pipeline_counts": dg.MetadataValue.json(manifest.counts.get("pipeline", {})),
        "shards": len(manifest.shards),
        "feature_extractor": ref["feature_extractor"],
        "feature_dim": manifest.feature_extractor.dim,
        "manifest": dg.MetadataValue.path(fileio.join(cfg.out, "manifest.json")),
        "dead_letter": fileio.join(cfg.out, manifest.dead_letter) if manifest.dead_letter else "",
        "raw_fingerprint": raw_snapshot.get("fingerprint", ""),
        "build_seconds": float(build.get("seconds", 0.0)),
        "library_log": dg.MetadataValue.path(str(log)),
    }
    return versioned(ref, manifest.dataset_version, metadata)


def _fingerprint(uri: str) -> dict:
    """What a raw input holds, cheaply: file count, bytes and a hash of (path, size, mtime).

    A changed, added or removed file changes it, so the snapshot's data version (and the UI's
    "upstream changed" marker) moves only when the input really did."""
    from pipelines import fileio

    h = hashlib.sha256()
    files = total = 0
    if fileio.is_local(uri):
        root = Path(uri)
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for p in paths:
            st = p.stat()
            h.update(
                f"{p.relative_to(root) if p != root else p.name}\t{st.st_size}\t{st.st_mtime_ns}\n".encode()
            )
            files, total = files + 1, total + st.st_size
    else:  # object stores: names only (sizes would cost a request per object)
        for p in sorted(fileio.list_files(fileio.join(uri, "**"))):
            h.update(f"{p}\n".encode())
            files += 1
    return {"fingerprint": h.hexdigest()[:16], "files": files, "bytes": total}


def _synthetic_corpus(path: str, overrides: dict, log: Callable[[str], None]) -> dict:
    """``mmlinks data synth``: regenerated only when the corpus there was made with other settings,
    with a progress line every tenth of the documents."""
    from pipelines.synthetic_corpus import SynthConfig, corpus_matches, write_corpus

    cfg = from_dict(SynthConfig, overrides, what="synthetic setting")  # validated when made
    reused = corpus_matches(path, cfg)
    if reused:
        log(f"synthetic corpus: {cfg.docs} documents (seed {cfg.seed}) already at {path}, reused")
    else:
        log(f"synthetic corpus: generating {cfg.docs} documents (seed {cfg.seed}) at {path}")
        write_corpus(path, cfg, progress=_every_tenth(cfg.docs, "synthetic corpus", log))
    return {"generated": not reused, "documents": cfg.docs, "seed": cfg.seed}


def _every_tenth(total: int, what: str, log: Callable[[str], None]) -> Callable[[int], None]:
    """A ``progress(n)`` callback that logs ``what: done of total documents (seconds)`` each tenth."""
    started, done, step = time.monotonic(), 0, max(1, -(-total // 10))

    def progress(n: int) -> None:
        nonlocal done
        before, done = done, done + n
        if done // step > before // step or done == total:
            log(f"{what}: {done} of {total} documents ({time.monotonic() - started:.0f} s)")

    return progress


def _copy_once(src: str, dst: str) -> dict:
    """Copy a dump into the snapshot folder unless the same bytes are there; sha256 of the copy."""
    from pipelines import fileio

    h = hashlib.sha256()
    if fileio.exists(dst) and fileio.is_local(src) and fileio.is_local(dst):
        if Path(src).stat().st_size == Path(dst).stat().st_size:
            with open(dst, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            return {"bytes": Path(dst).stat().st_size, "sha256": h.hexdigest(), "copied": False}
    size = 0
    with fileio.open_read(src) as fin, fileio.open_write(dst) as fout:
        for block in iter(lambda: fin.read(1 << 20), b""):
            h.update(block)
            fout.write(block)
            size += len(block)
    return {"bytes": size, "sha256": h.hexdigest(), "copied": True}
