"""Dagster resources: where data lives, the MLflow store, training (in-process or on a Ray
cluster) and the Reddit crawl, configured from the deployment's environment (docs/orchestration.md,
"Settings"). Why credentials are never resource fields: the UI shows those."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from pipelines.sources.reddit.config import DEFAULT_OVERLAP_S
from schemas.errors import MmlinksError

if TYPE_CHECKING:  # pragma: no cover
    from orchestration.ray_jobs import TrainingOutcome


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, "").strip() or default


class StorageResource(dg.ConfigurableResource):
    """``ROOT/raw/<source>`` (raw snapshots), ``ROOT/datasets/<source>`` (shards + manifest),
    ``ROOT/linked/<source>/<objective>`` (link shards), ``ROOT/crawl-state`` and ``ROOT/reports``.
    Builds write through ``root`` (a path or a gs://, s3:// URI); training and checks read through
    ``mount``, the local path where the same root is visible (a Cloud Storage FUSE volume at /data
    on the cluster; locally the same)."""

    root: str = "data"
    mount: str = ""

    def _join(self, base: str, *parts: str) -> str:
        from pipelines import fileio

        return fileio.join(base, *parts)

    def local_root(self) -> str:
        base = self.mount or self.root
        if "://" in base:
            raise MmlinksError(
                f"datasets root {base} is not a local path: set MMLINKS_DATASETS_MOUNT to where it is mounted"
            )
        return str(Path(base).resolve())

    def raw_uri(self, source: str) -> str:
        return self._join(self.root, "raw", source)

    def raw_path(self, source: str) -> str:
        return self._join(self.local_root(), "raw", source)

    def dataset_uri(self, source: str) -> str:
        return self._join(self.root, "datasets", source)

    def dataset_path(self, source: str) -> str:
        return self._join(self.local_root(), "datasets", source)

    def linked_uri(self, source: str, objective: str) -> str:
        """Where linked_<objective>[source] writes its link shards + manifest."""
        return self._join(self.root, "linked", source, objective)

    def archive_path(self, source: str, objective: str) -> str:
        """Where archive_index_<objective> writes its versioned index folders (local: FAISS
        writes files)."""
        return self._join(self.local_root(), "archive", source, objective)

    def crawl_state_uri(self, name: str) -> str:
        return self._join(self.root, "crawl-state", name)

    def reports_path(self) -> str:
        return self._join(self.local_root(), "reports")


class MlflowResource(dg.ConfigurableResource):
    """The tracking store and model registry: ``tracking_uri``, else MLFLOW_TRACKING_URI, else
    SQLite at ``<workdir>/mlflow.db`` (the CLI's rule with --workdir)."""

    tracking_uri: str = ""
    workdir: str = "data"

    def uri(self) -> str:
        from training.tracking import tracking_uri

        return self.tracking_uri or tracking_uri(self.workdir)

    def client(self):
        from mlflow.tracking import MlflowClient

        from training.tracking import seed_sqlite_store

        seed_sqlite_store(self.uri())
        return MlflowClient(self.uri())

    def _server(self) -> str | None:
        uri = self.uri()
        return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None

    def run_url(self, run_id: str) -> str | None:
        """The run's page in the MLflow UI (tracking servers only)."""
        server = self._server()
        if not server:
            return None
        exp = self.client().get_run(run_id).info.experiment_id
        return f"{server}/#/experiments/{exp}/runs/{run_id}"

    def artifact_url(self, run_id: str, path: str) -> str | None:
        server = self._server()
        return f"{server}/get-artifact?path={path}&run_uuid={run_id}" if server else None


class TrainingResource(dg.ConfigurableResource):
    """Runs ``training.experiment.run_experiment`` here, or, with ``ray_address`` set, the same
    through ``mmlinks train`` as a Ray job (``orchestration.ray_jobs``) whose log is streamed
    into the Dagster run. Cluster facts (workers, storage) are defaults under the settings'
    TrainConfig overrides."""

    ray_address: str = ""
    working_dir: str = ""  # uploaded with the job (a dev checkout); empty: the cluster image's code
    runtime_env_json: str = ""  # more of Ray's runtime_env, JSON (pip, env_vars, py_modules, ...)
    python: str = "python"
    storage_path: str = ""  # Ray Train storage (local path or shared URI); empty: next to the data
    # None: TrainConfig's default; 0: the loop in this process (no Ray Train worker processes)
    num_workers: int | None = None
    timeout_s: float = 12 * 3600.0

    def defaults(self) -> dict:
        out: dict = {}
        if self.storage_path:
            out["storage_path"] = self.storage_path
        if self.num_workers is not None:
            out["num_workers"] = self.num_workers
        return out

    def on_cluster(self) -> bool:
        return bool(self.ray_address.strip())

    def runtime_env(self) -> dict:
        env: dict = {}
        if self.runtime_env_json.strip():
            try:
                env = json.loads(self.runtime_env_json)
            except json.JSONDecodeError as exc:
                raise MmlinksError(f"MMLINKS_RAY_RUNTIME_ENV is not JSON: {exc}") from exc
            if not isinstance(env, dict):
                raise MmlinksError("MMLINKS_RAY_RUNTIME_ENV must be a JSON object (Ray's runtime_env)")
        if self.working_dir:
            env.setdefault("working_dir", str(Path(self.working_dir).resolve()))
        return env

    def train(
        self,
        cfg,
        *,
        model_name: str,
        alias: str,
        tracking_uri: str,
        report_dir: str,
        log: Callable[[str], None],
        job_metadata: dict[str, str] | None = None,
    ) -> TrainingOutcome:
        """The run's typed result (run id, model URI and version, best epoch, test and Random
        metrics, report), with the Ray job id when it ran on a cluster."""
        from orchestration.ray_jobs import TrainingOutcome

        if self.on_cluster():
            from orchestration.ray_jobs import JobSettings, submit_training

            settings = JobSettings(self.ray_address, self.runtime_env(), self.python, self.timeout_s)
            return submit_training(
                settings,
                cfg,
                model_name=model_name,
                alias=alias,
                tracking_uri=tracking_uri,
                on_log=log,
                metadata=job_metadata,
            )
        from models.experiment import run_experiment

        res = run_experiment(cfg, tracking_uri, model_name, alias, progress=False, report_dir=report_dir)
        return TrainingOutcome(res)


class RedditResource(dg.ConfigurableResource):
    """The r/DIY side: the incremental crawl of /new (the CLI's ``data crawl diy``) and the
    monthly dump files historical months are taken from."""

    subreddit: str = "DIY"
    dumps: str = ""  # folder (or URI) holding RS_YYYY-MM.zst monthly dumps
    api_base: str = ""  # replaces https://oauth.reddit.com (proxies, tests)
    limit: int = 0  # at most this many posts per crawl (0: all the listing gives)
    overlap_s: int = DEFAULT_OVERLAP_S

    def crawl(self, out: str, state: str) -> dict:
        """One incremental crawl (``pipelines.sources.reddit.crawl.run_crawl``, as `data crawl diy`):
        credentials from the environment, one-line errors with them scrubbed."""
        from pipelines.sources.reddit.crawl import run_crawl

        return run_crawl(
            state,
            out,
            subreddit=self.subreddit,
            limit=self.limit or None,
            overlap_s=self.overlap_s,
            api_base=self.api_base or None,
        )

    def dump_for(self, month: str) -> str | None:
        """The monthly dump ``RS_<month>.*`` under ``dumps``, if there is one."""
        from pipelines import fileio
        from pipelines.sources.reddit import dump_month, list_input_files

        if not self.dumps:
            return None
        if fileio.is_local(self.dumps) and not Path(self.dumps).exists():
            raise MmlinksError(f"the DIY dumps folder {self.dumps} (MMLINKS_DIY_DUMPS) does not exist")
        year, mon = (int(x) for x in month.split("-"))
        for path in sorted(list_input_files(self.dumps)):
            if dump_month(path) == (year, mon):
                return path
        return None


def resources_from_env() -> dict[str, dg.ConfigurableResource]:
    """The resources a deployment gets from its environment (see the table above)."""
    root = _env("MMLINKS_DATASETS_URI", "data")
    workers = _env("MMLINKS_TRAIN_WORKERS")
    try:
        num_workers = int(workers) if workers else None
    except ValueError:
        raise MmlinksError(f"MMLINKS_TRAIN_WORKERS wants a number, not {workers!r}") from None
    return {
        "storage": StorageResource(root=root, mount=_env("MMLINKS_DATASETS_MOUNT")),
        "mlflow": MlflowResource(
            tracking_uri=_env("MLFLOW_TRACKING_URI"), workdir=_env("MMLINKS_DATASETS_MOUNT", root)
        ),
        "training": TrainingResource(
            ray_address=_env("MMLINKS_RAY_ADDRESS"),
            working_dir=_env("MMLINKS_RAY_WORKING_DIR"),
            runtime_env_json=_env("MMLINKS_RAY_RUNTIME_ENV"),
            python=_env("MMLINKS_RAY_PYTHON", "python"),
            storage_path=_env("MMLINKS_RAY_STORAGE_PATH"),
            num_workers=num_workers,
        ),
        "reddit": RedditResource(
            dumps=_env("MMLINKS_DIY_DUMPS"),
            api_base=_env("MMLINKS_REDDIT_API_BASE"),
        ),
    }
