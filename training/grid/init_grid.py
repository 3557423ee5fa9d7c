"""Table 2's divide and conquer from a finished Table 1 grid: ``--init-from-grid RUN_ID``.

Picks each dataset's and source's ``full@SOURCE`` trial by its validation selection metric
(never a test one), downloads its checkpoint and hands the trials ``init_from`` (caption first).
Why a finished grid, not a first Tune stage: Tune has no dependencies between trials, and the
encoders fused should be the very models Table 1 reports; MLflow works with a remote server too.
Another dataset version or architecture (``ARCH_FIELDS``) is refused before any trial."""

from __future__ import annotations

import math
from pathlib import Path

from schemas.errors import MmlinksError
from training.config import SELECTION_ORDER, TrainConfig

TABLE1, FULL_ROW = "news-table1", "full"
# caption first: divide and conquer takes the shared parts from the first listed source
INIT_ORDER = ("caption", "body", "headline", "lead")
ARCH_FIELDS = ("d_shared", "news_heads", "news_encoder", "word_vectors", "min_word_count", "max_tokens")
CHECKPOINT_PATH = "artifacts/checkpoint"  # inside a logged news model (models/news_serving.py)


def _parent(client, run_id: str):
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        raise MmlinksError(f"--init-from-grid {run_id}: no such MLflow run ({exc.message})") from exc
    tags = run.data.tags
    if tags.get("mmlinks.grid") != TABLE1 or tags.get("mmlinks.grid.role") != "parent":
        raise MmlinksError(
            f"--init-from-grid {run_id}: not the parent run of a {TABLE1} grid "
            f"(grid {tags.get('mmlinks.grid') or 'none'}, role {tags.get('mmlinks.grid.role') or 'none'})"
        )
    return run


def _validation_value(client, run) -> float | None:
    """The best value of the metric the trial chose its checkpoint by (None: never logged)."""
    metric = run.data.params.get("select_by", "val_medr")
    values = [m.value for m in client.get_metric_history(run.info.run_id, metric)]
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return None
    best = min(values) if SELECTION_ORDER.get(metric, "min") == "min" else -max(values)
    return best  # lower is better either way


def best_trials(client, parent_run_id: str) -> dict[tuple[str, str], object]:
    """{(dataset column, source): the finished full@SOURCE trial run of the Table 1 grid with the
    best validation value} (ties: the lower seed)."""
    parent = _parent(client, parent_run_id)
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}' and attributes.status = 'FINISHED'",
        max_results=10_000,
    )
    ranked: dict[tuple[str, str], list] = {}
    for run in runs:
        point = run.data.tags.get("mmlinks.grid.point", "")  # e.g. full@caption-s0
        row, _, rest = point.partition("@")
        source, _, seed = rest.rpartition("-s")
        value = _validation_value(client, run) if row == FULL_ROW else None
        if value is not None:
            key = (run.data.tags.get("mmlinks.grid.dataset", ""), source)
            ranked.setdefault(key, []).append((value, int(seed) if seed.isdigit() else 0, run))
    return {k: min(v, key=lambda x: x[:2])[2] for k, v in ranked.items()}


def _check_trial(run, base: TrainConfig, dataset_version: str, where: str) -> None:
    params = run.data.params
    if params.get("dataset_version") != dataset_version:
        raise MmlinksError(
            f"--init-from-grid: {where} was trained on dataset version {params.get('dataset_version')}, "
            f"this grid's dataset is {dataset_version} (divide and conquer needs the same vocabulary)"
        )
    bad = [f for f in ARCH_FIELDS if f in params and params[f] != str(getattr(base, f))]
    if bad:
        diff = ", ".join(f"{f} {params[f]} there, {getattr(base, f)} here" for f in bad)
        raise MmlinksError(
            f"--init-from-grid: {where} has another architecture ({diff}); pass the same flags"
        )


def logged_checkpoint(client, run, dest: Path) -> Path:
    """The checkpoint folder of the news model ``run`` logged, downloaded to ``dest`` (reused
    when a previous grid already downloaded it; the staged recipe's single-source stages too,
    ``training/news/staged.py``)."""
    import mlflow

    folder = dest / "checkpoint"
    if (folder / "meta.json").is_file():
        return folder
    models = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
    )
    model = next((m for m in models if m.name == "model"), None)
    if model is None:
        raise MmlinksError(f"run {run.info.run_id} logged no news model (its checkpoint is what is loaded)")
    dest.mkdir(parents=True, exist_ok=True)
    uri = f"{model.artifact_location.rstrip('/')}/{CHECKPOINT_PATH}"
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dest)))


def table1_encoders(
    tracking_uri: str, parent_run_id: str, datasets: dict[str, str], base: TrainConfig, dest: Path
) -> dict[str, dict]:
    """{dataset column: the TrainConfig overrides of its divide-and-conquer trials} from the
    Table 1 grid ``parent_run_id``: ``init_from`` (the four checkpoints, caption first),
    ``subword_buckets`` (the encoders' n-gram table) and ``fuser_warmup_epochs`` (at least the
    paper's 1). Checkpoints are downloaded under ``dest``."""
    from mlflow.tracking import MlflowClient

    from schemas.manifest import Manifest

    client = MlflowClient(tracking_uri)
    best = best_trials(client, parent_run_id)
    out = {}
    for name, data in datasets.items():
        version = Manifest.read(data).dataset_version
        parts, buckets = [], set()
        for source in INIT_ORDER:
            run = best.get((name, source))
            if run is None:
                raise MmlinksError(
                    f"--init-from-grid {parent_run_id}: no finished '{FULL_ROW}@{source}' trial on dataset "
                    f"{name!r} (run --grid {TABLE1} --grid-rows {FULL_ROW} with --grid-data {name}=DIR)"
                )
            where = f"trial {run.data.tags.get('mmlinks.grid.point')} ({run.info.run_id})"
            _check_trial(run, base, version, where)
            buckets.add(int(run.data.params.get("subword_buckets", "0")))
            folder = logged_checkpoint(client, run, dest / parent_run_id / name / source)
            parts.append(f"{source}={folder.resolve()}")
        out[name] = {
            "init_from": ",".join(parts),
            "subword_buckets": buckets.pop() if len(buckets) == 1 else base.subword_buckets,
            "fuser_warmup_epochs": max(1, base.fuser_warmup_epochs),
        }
    return out
