"""MLflow tracking and registry: where runs, metrics and models go.

Default store is a local SQLite file (no server); ``MLFLOW_TRACKING_URI`` overrides it, so the
same code logs to a tracking server on a cluster. Credentials for a server come only from the
environment (MLFLOW_TRACKING_TOKEN etc.), which MLflow reads itself; nothing here logs them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import platform
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from schemas.manifest import Manifest
from training.run_inputs import RunInputs

EXPERIMENT = "mmlinks"  # the MLflow experiment of every training run

SQLITE_BUSY_TIMEOUT_S = 60


def _sqlite_busy_timeout(dbapi_connection, _record) -> None:
    import sqlite3

    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}")


def wait_for_sqlite_locks() -> None:
    """Let every SQLite connection of this process wait up to 60 s for another writer's lock.

    Concurrent writers share the default SQLite store: grid trials, and a run's rank-0 worker
    logging epochs next to its driver. sqlite3 gives up after 5 s ("database is locked"), which a
    loaded laptop exceeds, and MLflow has no setting for it; a SQLAlchemy connect hook does.
    """
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "connect", _sqlite_busy_timeout):
        event.listen(Engine, "connect", _sqlite_busy_timeout)


wait_for_sqlite_locks()


def tracking_uri(workdir: str | Path) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{(Path(workdir) / 'mlflow.db').resolve()}"


def template_cache_dir() -> Path:
    """Where the empty-store template lives: ``$XDG_CACHE_HOME/mmlinks`` (``~/.cache/mmlinks``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mmlinks"


def _empty_store_template() -> Path:
    """An SQLite file holding MLflow's tables and nothing else, made once per MLflow version."""
    path = template_cache_dir() / f"mlflow-{mlflow.__version__}-empty.db"
    if path.exists():
        return path
    from mlflow.store.db.utils import _initialize_tables  # what MLflow runs on an empty store
    from sqlalchemy import create_engine

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    engine = create_engine(f"sqlite:///{tmp}")
    try:
        _initialize_tables(engine)
    finally:
        engine.dispose()
    os.replace(tmp, path)  # whole or absent, whoever else makes it at the same time
    return path


def seed_sqlite_store(uri: str) -> None:
    """Give a new local SQLite store its tables by copying an empty, migrated one.

    MLflow makes a new SQLite store's tables by running every schema migration since its first
    release, about 3 CPU-seconds paid by the first command in each new workdir (and by every
    test that trains); copying a store migrated once per MLflow version takes milliseconds. The
    copy holds no experiment: MLflow adds its Default experiment, with this store's artifact
    root, when it opens it. Any failure leaves the store to MLflow, which then migrates as usual.
    """
    if not uri.startswith("sqlite:///"):
        return
    db = Path(uri[len("sqlite:///") :])
    if db.exists():
        return
    try:
        template = _empty_store_template()
        db.parent.mkdir(parents=True, exist_ok=True)
        tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
        shutil.copyfile(template, tmp)
        try:
            os.link(tmp, db)  # never replaces a store another process made in the meantime
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    except Exception as exc:  # an optimisation: MLflow's own path still works
        logging.getLogger(__name__).debug("no empty-store template for %s: %s", db, exc)


def configure(uri: str, experiment: str) -> str:
    """Point MLflow at ``uri`` and make sure the experiment exists; returns its id."""
    seed_sqlite_store(uri)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        artifact_location = None
        if uri.startswith("sqlite:///"):  # keep artifacts next to the local database
            artifact_location = (Path(uri[len("sqlite:///") :]).parent / "mlartifacts").resolve().as_uri()
        return client.create_experiment(experiment, artifact_location=artifact_location)
    return exp.experiment_id


PACKAGES = ("torch", "ray", "apache-beam", "mlflow", "pyarrow", "numpy", "mmlinks")


def git_commit(cwd: str | Path | None = None) -> str:
    """The commit of the checkout the code runs from, or "unknown" (e.g. an installed wheel)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd or Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def log_training_params(config: dict, manifest: Manifest, data_dir: str | Path) -> None:
    """Config (``TrainConfig.public_dict``), dataset identity and provenance as params; system
    facts as tags; the dataset as an MLflow dataset input."""
    import mlflow.data
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    manifest_path = Path(data_dir) / "manifest.json"
    params = dict(config)
    params.update(
        {
            "dataset_version": manifest.dataset_version,
            "dataset_source": manifest.source,
            "dataset_manifest_sha256": hashlib.sha256(manifest_path.read_bytes()).hexdigest(),
            "feature_extractor": f"{manifest.feature_extractor.name}@{manifest.feature_extractor.version}",
            "schema_version": manifest.schema_version,
            "git_commit": git_commit(),
            **{f"version.{k}": v for k, v in package_versions().items()},
        }
    )
    mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
    mlflow.set_tags(
        {
            "system.python": platform.python_version(),
            "system.platform": platform.platform(),
            "system.cpus": str(os.cpu_count()),
            "system.hostname": platform.node(),
        }
    )
    source = resolve_dataset_source(str(manifest_path.resolve()))
    dataset = MetaDataset(
        source=source, name=f"{manifest.source}-{manifest.dataset_version}", digest=manifest.dataset_version
    )
    mlflow.log_input(dataset, context="training")


def log_model_params(run_id: str, tracking_uri: str, model_cfg: dict) -> None:
    """The model config as resolved from the training split, as ``model.<field>`` params: the
    user's options are logged as given (``image_centring auto``, ``image_dropout -1``); these say
    what ``auto`` chose on this dataset (issue #44). Scalars only (vocabulary size, widths, the
    image side); nested values stay in the checkpoint's config."""
    from mlflow.entities import Param

    params = [
        Param(f"model.{k}", str(v)[:500])
        for k, v in model_cfg.items()
        if isinstance(v, (str, int, float, bool)) or v is None
    ]
    if params:
        MlflowClient(tracking_uri).log_batch(run_id, params=params)


def log_choice(run_id: str, tracking_uri: str, choice) -> None:
    """What the backbone chose by measuring the corpus (issue #60): ``choice.<field>`` params, the
    pick as ``choice``, each candidate's first-round criterion as ``choice_score.<candidate>``
    and each finalist's after the run's epochs as ``choice_final_score.<candidate>`` metrics, so a
    user sees what was chosen and why (``choice.json`` holds the whole record)."""
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri)
    params = [
        Param("choice", choice.name),
        *(Param(f"choice.{k}", str(v)) for k, v in choice.overrides.items()),
    ]
    now = int(time.time() * 1000)
    metrics = [
        Metric(f"{prefix}.{k.replace('+', '_')}", float(v), now, 0)
        for prefix, scores in [("choice_score", choice.scores), ("choice_final_score", choice.finalists)]
        for k, v in scores.items()
        if v is not None
    ]
    client.log_batch(run_id, params=params, metrics=metrics)
    client.log_dict(run_id, choice.to_dict(), "choice.json")


def register(model_uri: str, name: str, alias: str | None, uri: str, attempts: int = 5) -> str:
    """Register ``model_uri`` under ``name`` and point ``alias`` at the new version.

    MLflow's SQL stores set an alias by reading, then inserting its row: two trainings that
    register the same name at once can both insert, and the loser's request fails with a
    unique-key violation after its version was registered (``tests/faults/
    test_promotion_crash.py``). The row then exists, so setting the alias again updates it.
    A plain loop, not tenacity: one exception text, no wait between attempts (the second
    attempt updates the row the race left), and no dependency for eight lines."""
    # MLflow prints "Successfully registered model ..." / "Created version ..." to stderr whatever
    # its log level: kept off the user's terminal, in the log at debug (the result names the version)
    chatter = io.StringIO()
    with contextlib.redirect_stderr(chatter):
        version = mlflow.register_model(model_uri, name)
    logging.getLogger(__name__).debug("%s", chatter.getvalue().strip())
    if alias:
        client = MlflowClient(uri)
        for attempt in range(attempts):
            try:
                client.set_registered_model_alias(name, alias, version.version)
                break
            except MlflowException as exc:
                text = str(exc).lower()  # PostgreSQL's words, and SQLite's
                raced = any(w in text for w in ("duplicate key", "unique constraint failed"))
                if not raced or attempt == attempts - 1:
                    raise
    return str(version.version)


RESUME_KEY_TAG = "mmlinks.train_run"  # one training run (run name + storage), across its commands
DRIVER_TAGS = ("mmlinks.driver_host", "mmlinks.driver_pid")


def _driver_alive(tags: dict) -> bool:
    """Whether the run's driver process still lives on this machine (a command resuming a run
    that is in fact still training must not end it); a driver on another host counts as gone."""
    from training.processes import process_alive

    return process_alive(*(tags.get(t) for t in DRIVER_TAGS))


def close_abandoned_runs(client: MlflowClient, run, key: str) -> list[str]:
    """Mark ``KILLED`` the earlier MLflow runs of the same training run (tag ``key``) that are
    still ``RUNNING``: their command was killed (SIGKILL, a lost node) before it could end them,
    and ``run`` now resumes their checkpoints. Each gets ``mmlinks.resumed_by`` = ``run``'s id;
    ``run`` gets ``mmlinks.resumes`` = their ids. MLflow itself never ends a run whose process
    died (a ``with mlflow.start_run()`` that never exits leaves it ``RUNNING``). Returns the ids."""
    run_id = run.info.run_id
    found = client.search_runs(
        [run.info.experiment_id],
        filter_string=f"tags.`{RESUME_KEY_TAG}` = '{key}' and attributes.status = 'RUNNING'",
        max_results=1000,
    )
    ended = []
    for old in found:
        if old.info.run_id == run_id or _driver_alive(old.data.tags):
            continue
        client.set_tag(old.info.run_id, "mmlinks.resumed_by", run_id)
        client.set_terminated(old.info.run_id, "KILLED")
        ended.append(old.info.run_id)
    if ended:
        client.set_tag(run_id, "mmlinks.resumes", ",".join(ended))
    return ended


def claim_training_run(run, key: str, tracking_uri: str) -> list[str]:
    """Tag ``run`` as the current command of the Ray Train run of ``key`` (with its driver's
    host and pid), and mark ``KILLED`` the earlier commands' MLflow runs of it left ``RUNNING``
    by a kill (``close_abandoned_runs``): this command resumes their checkpoints. Returns their ids."""
    host, pid = DRIVER_TAGS
    mlflow.set_tags({RESUME_KEY_TAG: key, host: platform.node(), pid: str(os.getpid())})
    return close_abandoned_runs(MlflowClient(tracking_uri), run, key)


@contextlib.contextmanager
def open_run(inputs: RunInputs, tracking_uri: str, parent_run_id: str | None):
    """The experiment's MLflow run of ``inputs``, with the config and dataset logged on it;
    claimed for its Ray Train run when ``--run-name`` names one (``training.experiment``)."""
    cfg = inputs.cfg
    manifest = inputs.manifest
    configure(tracking_uri, EXPERIMENT)
    mlflow.set_experiment(EXPERIMENT)
    tags = {"mlflow.parentRunId": parent_run_id} if parent_run_id else None
    with mlflow.start_run(run_name=cfg.label, tags=tags) as run:
        log_training_params(inputs.params, manifest, cfg.data)
        mlflow.log_dict(inputs.params, "config/train_config.json")
        mlflow.log_artifact(str(Path(cfg.data) / "manifest.json"), "dataset")
        mlflow.set_tags({"mmlinks.dataset_version": manifest.dataset_version})
        if inputs.resume_key:
            claim_training_run(run, inputs.resume_key, tracking_uri)
        yield run


def set_stage(run_id: str, tracking_uri: str, text: str) -> None:
    """What the run is doing before its first epoch (the image side's trials), for the epoch bar."""
    MlflowClient(tracking_uri).set_tag(run_id, "mmlinks.stage", text)


def poll_epochs(client, run_id: str) -> tuple[int, dict] | None:
    """(epochs logged so far, the bar's postfix) from the run's metrics, before the first epoch
    its ``mmlinks.stage`` tag; None if the store is busy (that only delays the bar)."""
    try:
        hist = client.get_metric_history(run_id, "val_loss")
        auc = client.get_metric_history(run_id, "val_auc")
        within = client.get_metric_history(run_id, "val_within")
        stage = None if hist else client.get_run(run_id).data.tags.get("mmlinks.stage")
    except MlflowException:
        return None
    if not hist:
        return 0, {"stage": stage} if stage else {}
    post = {"val_loss": f"{hist[-1].value:.4f}"}
    if auc:
        post["val_auc"] = f"{auc[-1].value:.1f}"
    if within:
        post["val_within"] = f"{within[-1].value:.3f}"
    return len(hist), post


def epoch_progress(tracking_uri: str, run_id: str, epochs: int, enabled: bool):
    """The epoch bar: ``poll_epochs`` on the MLflow store every 2 s while the body runs (off for
    ``--json`` callers). The training loop runs in Ray worker processes; the tracking store is
    the one channel the driver already shares with them, and it works the same on a cluster."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri) if enabled else None
    from schemas.progress import polled_progress

    return polled_progress(
        "train", total=epochs, unit="epoch", poll=lambda: poll_epochs(client, run_id), enabled=enabled
    )


def finished_run(resume_key: str, epochs: int, tracking_uri: str) -> tuple[str, str, str | None, int] | None:
    """(run id, model URI, registered version or None, best epoch) of an earlier command that
    finished the training run of ``resume_key`` (same name and storage) with ``epochs``, or
    None. A retried pipeline step reruns the same command: it must not train zero epochs and
    register a copy of the model as a new version (``training.experiment``)."""
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        return None
    found = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{RESUME_KEY_TAG}` = '{resume_key}' "
        f"and attributes.status = 'FINISHED' and params.epochs = '{epochs}'",
        order_by=["attributes.end_time DESC"],
        max_results=1,
    )
    if not found:
        return None
    run = found[0]
    versions = sorted(
        client.search_model_versions(f"run_id = '{run.info.run_id}'"), key=lambda v: int(v.version)
    )
    model_uri, version = f"runs:/{run.info.run_id}/model", None
    if versions:
        version = str(versions[-1].version)
        model_uri = f"models:/{versions[-1].name}/{version}"
    best = run.data.metrics.get("best_epoch")
    return run.info.run_id, model_uri, version, -1 if best is None else int(best)
