"""The asset graph: raw snapshots -> dataset versions -> per-objective models -> evaluations ->
the production alias. Each asset is a small function of its upstream assets that calls what the
CLI calls (``pipelines.synthetic_corpus.write_corpus``, ``pipelines.build``, ``data crawl diy``,
``training.experiment.run_experiment``, ``training.registry``); I/O and external systems come
from resources. Assets return small JSON-able dicts that point at the data (paths, versions, run
ids); the data itself stays where the libraries write it.

    diy_submissions[month] ··> raw_snapshot[source] -> dataset[source] -> model/<obj>[source]
                                                                      \\-> evaluation/<obj>[source]
                                                                           -> production/<obj>[source]

Expected failures (a missing input, a refused config or credential, a dataset that fails its
checks) raise ``dg.Failure`` with the one-line cause and no retry; flaky ones (networks, the
cluster) are retried by the step's RetryPolicy, with backoff.
"""

import contextlib
import hashlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
from dagster import AssetExecutionContext

from orchestration.quality import check_evaluation_floor, dataset_outcomes, require
from orchestration.resources import MlflowResource, RedditResource, StorageResource, TrainingResource
from orchestration.settings import Settings
from schemas.errors import MmlinksError

DIY = "diy"
SYNTHETIC = "synthetic"
CANDIDATE = "candidate"


def source_partitions(settings: Settings) -> dg.StaticPartitionsDefinition:
    return dg.StaticPartitionsDefinition(list(settings.sources))


def month_partitions(settings: Settings) -> dg.MonthlyPartitionsDefinition:
    """r/DIY by creation month, from the first month of the paper's crawl to the current one
    (``end_offset=1``: the month in progress is the one the weekly crawl adds to)."""
    return dg.MonthlyPartitionsDefinition(start_date=settings.diy_first_month, fmt="%Y-%m", end_offset=1)


def retry_policy(settings: Settings) -> dg.RetryPolicy:
    return dg.RetryPolicy(
        max_retries=settings.max_retries,
        delay=settings.retry_delay_s,
        backoff=dg.Backoff.EXPONENTIAL,
        jitter=dg.Jitter.PLUS_MINUS,
    )


# Exceptions behind a one-line MmlinksError that a later attempt may not meet: the network, a
# server's 5xx or 429 (prawcore's names; the CLI's crawl wraps them with the credential scrubbed).
TRANSIENT_CAUSES = ("RequestException", "ServerError", "TooManyRequests", "Timeout", "ReadTimeout")


def is_transient(exc: BaseException) -> bool:
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, ConnectionError | TimeoutError) or type(cause).__name__ in TRANSIENT_CAUSES:
            return True
        cause = cause.__cause__
    return False


def versioned(value: dict, version: str, metadata: dict) -> dg.Output:
    """An output with a data version (the fingerprint, dataset version or model version), which
    drives the UI's "upstream changed" markers; Dagster 1.13 still calls the parameter beta."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=dg.BetaWarning)
        return dg.Output(value, data_version=dg.DataVersion(version), metadata=metadata)


@contextlib.contextmanager
def failures_explained(what: str) -> Iterator[None]:
    """Expected errors become a Dagster Failure with their one-line cause. Those a retry cannot
    fix (a refused option, input or credential) skip the retry policy; network and cluster
    hiccups keep it. Anything unexpected propagates as itself, and is retried."""
    from orchestration.ray_jobs import RayJobError

    try:
        yield
    except RayJobError as exc:
        raise dg.Failure(
            description=f"{what}: {exc}",
            metadata={"cause": str(exc), "ray_job_id": exc.job_id or ""},
            allow_retries=exc.transient,
        ) from exc
    except MmlinksError as exc:
        raise dg.Failure(
            description=f"{what}: {exc}", metadata={"cause": str(exc)}, allow_retries=is_transient(exc)
        ) from exc


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


def _synthetic_corpus(path: str, overrides: dict) -> dict:
    """``mmlinks data synth``: regenerated only when the corpus there was made with other settings."""
    from pipelines.synthetic_corpus import SynthConfig, write_corpus

    try:
        cfg = SynthConfig(**overrides)
    except TypeError as exc:
        raise MmlinksError(f"synthetic settings: {exc}") from exc
    if cfg.docs < 1 or cfg.images_min < 1 or cfg.images_max < cfg.images_min or cfg.image_size < 32:
        raise MmlinksError(
            "synthetic settings need docs >= 1, 1 <= images_min <= images_max, image_size >= 32"
        )
    meta = Path(path) / "corpus.json"  # written last: its presence marks a complete corpus
    reused = False
    if meta.exists():
        try:
            saved = json.loads(meta.read_text())
        except (OSError, json.JSONDecodeError):
            saved = {}
        reused = isinstance(saved, dict) and all(saved.get(k) == v for k, v in asdict(cfg).items())
    if not reused:
        write_corpus(path, cfg)
    return {"generated": not reused, "documents": cfg.docs, "seed": cfg.seed}


def build_assets(settings: Settings) -> list[dg.AssetsDefinition]:
    sources = source_partitions(settings)
    months = month_partitions(settings)
    retry = retry_policy(settings)

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

    @dg.asset(
        partitions_def=sources,
        group_name="raw",
        deps=[dg.AssetDep(diy_submissions, partition_mapping=dg.AllPartitionMapping())],
        description="The raw input of one source, fingerprinted: the synthetic corpus is generated "
        "(mmlinks data synth); other sources are read where settings.raw_inputs or ROOT/raw/<source> "
        "says (for diy: the monthly folders diy_submissions fills).",
    )
    def raw_snapshot(context: AssetExecutionContext, storage: StorageResource) -> dg.Output[dict]:
        from pipelines import fileio

        source = context.partition_key
        extra: dict = {}
        with failures_explained(f"raw {source}"):
            if source == SYNTHETIC and source not in settings.raw_inputs:
                uri = storage.raw_path(source)
                extra = _synthetic_corpus(uri, settings.synthetic)
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
            fp = _fingerprint(uri)
        if fp["files"] == 0:
            raise dg.Failure(description=f"raw {source}: {uri} holds no files", allow_retries=False)
        snapshot = {"source": source, "uri": uri, **fp, **extra}
        return versioned(snapshot, fp["fingerprint"], {"uri": uri, **fp, **extra})

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
        from pipelines import fileio
        from pipelines.build import build_dataset
        from pipelines.build_config import BuildConfig
        from pipelines.commit import last_build

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
            context.log.info(f"building {source} with Beam ({cfg.runner}) -> {cfg.out}")
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
        }
        return versioned(ref, manifest.dataset_version, metadata)

    out = [diy_submissions, raw_snapshot, dataset]
    for objective in settings.objectives:
        out += _objective_assets(settings, objective, sources, retry)
    return out


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


def current_dataset(ref: dict, thresholds) -> None:
    """The guard every consumer of a dataset runs: the manifest on disk is still the version the
    upstream asset produced, and it passes the dataset checks (which a run started later, by a
    sensor or by hand, cannot otherwise see)."""
    from schemas.manifest import Manifest

    manifest = Manifest.read(ref["path"])
    if manifest.dataset_version != ref["dataset_version"]:
        raise MmlinksError(
            f"dataset {ref['source']} is now version {manifest.dataset_version}, not the "
            f"{ref['dataset_version']} the dataset asset recorded: materialize dataset[{ref['source']}] again"
        )
    require(
        dataset_outcomes(manifest, ref["path"], thresholds),
        f"dataset {ref['source']} {ref['dataset_version']}",
    )


def _objective_assets(
    settings: Settings, objective: str, sources: dg.StaticPartitionsDefinition, retry: dg.RetryPolicy
) -> list[dg.AssetsDefinition]:
    model_key = dg.AssetKey(["model", objective])
    evaluation_key = dg.AssetKey(["evaluation", objective])

    @dg.asset(
        key=model_key,
        partitions_def=sources,
        group_name="training",
        kinds={"ray", "pytorch", "mlflow"},
        retry_policy=retry,
        ins={"dataset": dg.AssetIn("dataset")},
        description=f"The {objective} model trained on the dataset (training.experiment.run_experiment: Ray "
        f"Train, best checkpoint by validation loss, MLflow run, registered as '{CANDIDATE}'); on a Ray "
        "cluster through the Ray Jobs API when MMLINKS_RAY_ADDRESS is set.",
    )
    def model(
        context: AssetExecutionContext,
        dataset: dict,
        training: TrainingResource,
        mlflow: MlflowResource,
        storage: StorageResource,
    ) -> dg.Output[dict]:
        source = context.partition_key
        name = settings.registered_model_name(source, objective)
        with failures_explained(f"model {objective} on {source}"):
            current_dataset(dataset, settings.thresholds_config())
            cfg = settings.train_config(objective, dataset["path"], **training.defaults())
            cfg.validate()
            where = f"Ray cluster {training.ray_address}" if training.on_cluster() else "in-process Ray"
            context.log.info(f"training {cfg.label} on {source} {dataset['dataset_version']} ({where})")
            result = training.train(
                cfg,
                model_name=name,
                alias=CANDIDATE,
                tracking_uri=mlflow.uri(),
                report_dir=storage.reports_path(),
                log=context.log.info,
                job_metadata={
                    "dagster_run_id": context.run_id,
                    "asset": f"model/{objective}",
                    "source": source,
                },
            )
        test, rand = result.get("test", {}), result.get("random", {})
        ref = {
            "source": source,
            "objective": objective,
            "model_name": name,
            "model_version": str(result["model_version"]),
            "model_uri": result["model_uri"],
            "run_id": result["run_id"],
            "dataset_version": dataset["dataset_version"],
            "dataset_path": dataset["path"],
            "test": test,
            "random": rand,
            "report": result.get("report", ""),
            "ray_job_id": result.get("ray_job_id", ""),
        }
        metadata = {
            "mlflow_run_id": result["run_id"],
            "model_name": name,
            "model_version": ref["model_version"],
            "model_uri": result["model_uri"],
            "best_epoch": result.get("best_epoch", -1),
            "dataset_version": dataset["dataset_version"],
            "train_config": dg.MetadataValue.json(cfg.public_dict()),
            "test_auc": float(test.get("auc", float("nan"))),
            "test_p_at_1": float(test.get("p_at_1", float("nan"))),
            "random_auc": float(rand.get("auc", float("nan"))),
            "tracking_uri": mlflow.uri(),
            **_report_links(mlflow, result["run_id"], ref["report"]),
        }
        if ref["ray_job_id"]:
            metadata["ray_job_id"] = ref["ray_job_id"]
        return versioned(ref, f"{name}/{ref['model_version']}", metadata)

    @dg.asset(
        key=evaluation_key,
        partitions_def=sources,
        group_name="training",
        kinds={"mlflow"},
        ins={"model": dg.AssetIn(model_key), "dataset": dg.AssetIn("dataset")},
        description=f"The registered {objective} version scored through its pyfunc model on the frozen "
        f"{settings.promotion_split} split (training.registry.evaluate_model_uri, what promotion uses), "
        "next to the Random baseline of its training run.",
    )
    def evaluation(
        context: AssetExecutionContext, model: dict, dataset: dict, mlflow: MlflowResource
    ) -> dg.Output[dict]:
        from training.registry import evaluate_model_uri

        split = settings.promotion_split
        with failures_explained(f"evaluation {objective} on {dataset['source']}"):
            if model["dataset_version"] != dataset["dataset_version"]:
                raise MmlinksError(
                    f"model {model['model_name']} v{model['model_version']} was trained on dataset "
                    f"{model['dataset_version']}, the dataset is now {dataset['dataset_version']}: "
                    "train again"
                )
            uri = f"models:/{model['model_name']}/{model['model_version']}"
            scores = evaluate_model_uri(uri, dataset["path"], split, mlflow.uri())
        rand = model.get("random", {})
        ref = {
            **{k: model[k] for k in ("source", "objective", "model_name", "model_version", "run_id")},
            "dataset_version": dataset["dataset_version"],
            "split": split,
            **{k: float(v) for k, v in scores.items()},
            "random_auc": float(rand.get("auc", float("nan"))),
            "random_p_at_1": float(rand.get("p_at_1", float("nan"))),
        }
        metadata = {
            **{k: float(v) for k, v in scores.items()},
            "random_auc": ref["random_auc"],
            "split": split,
            "model_version": model["model_version"],
            "mlflow_run_id": model["run_id"],
            **_report_links(mlflow, model["run_id"], model.get("report", "")),
        }
        return dg.Output(ref, metadata=metadata)

    @dg.asset(
        key=dg.AssetKey(["production", objective]),
        partitions_def=sources,
        group_name="promotion",
        kinds={"mlflow"},
        ins={"evaluation": dg.AssetIn(evaluation_key), "dataset": dg.AssetIn("dataset")},
        description=f"The 'production' alias of the {objective} model: moved to the candidate only "
        "through training.registry.promote's gate (candidate vs production on the same split, AUC and "
        "p@1 drops, AUC floor), under the registry's promotion lock. A refused promotion fails here.",
    )
    def production(
        context: AssetExecutionContext, evaluation: dict, dataset: dict, mlflow: MlflowResource
    ) -> dg.Output[dict]:
        from training.registry import promote

        name = evaluation["model_name"]
        client = mlflow.client()
        with failures_explained(f"promotion of {name}"):
            require([check_evaluation_floor(evaluation, settings.thresholds_config())], f"{name} evaluation")
            candidate = _alias_version(client, name, CANDIDATE)
            if candidate != evaluation["model_version"]:
                raise MmlinksError(
                    f"{name}'s candidate is version {candidate}, the evaluation scored version "
                    f"{evaluation['model_version']}: evaluate the current candidate first"
                )
            result = promote(client, name, dataset["path"], settings.gate_config(), settings.promotion_split)
        meta = {
            "model_name": name,
            "candidate_version": result.candidate_version,
            "previous_production_version": result.production_version or "",
            "candidate_metrics": dg.MetadataValue.json(result.candidate_metrics),
            "production_metrics": dg.MetadataValue.json(result.production_metrics or {}),
            "gate": dg.MetadataValue.json(asdict(settings.gate_config())),
        }
        if not result.promoted:
            raise dg.Failure(
                description=f"promotion of {name} version {result.candidate_version} refused: "
                + "; ".join(result.failures),
                metadata={**meta, "failures": dg.MetadataValue.json(result.failures)},
                allow_retries=False,
            )
        ref = {
            "model_name": name,
            "production_version": result.candidate_version,
            "previous_version": result.production_version,
            "model_uri": f"models:/{name}@production",
            "dataset_version": dataset["dataset_version"],
            "metrics": result.candidate_metrics,
        }
        return versioned(ref, f"{name}/{result.candidate_version}", {**meta, "model_uri": ref["model_uri"]})

    return [model, evaluation, production]


def _alias_version(client, name: str, alias: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower():
            return None
        raise MmlinksError(f"cannot read {name}@{alias}: {exc.message}") from exc


def _report_links(mlflow: MlflowResource, run_id: str, report: str) -> dict:
    """Where to read the HTML evaluation report: the MLflow server's copy and the file."""
    out: dict = {}
    url = mlflow.artifact_url(run_id, "report.html")
    if url:
        out["report_url"] = dg.MetadataValue.url(url)
        run = mlflow.run_url(run_id)
        if run:
            out["mlflow_run"] = dg.MetadataValue.url(run)
    if report:
        out["report"] = dg.MetadataValue.path(report)
    return out
