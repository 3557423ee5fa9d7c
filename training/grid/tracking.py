"""The grid's MLflow bookkeeping: tracking URIs that survive Tune's working directories, the
dataset inputs logged on the parent run, and the parent run's parameters and artifacts."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from training.config import TrainConfig
from training.grid.results import GridResult
from training.grid.rows import GridSpec, point_b


def _absolute_tracking_uri(uri: str) -> str:
    """Tune runs each trial in its own working directory, so a relative sqlite path would open
    a fresh empty database there; anchor it to this process's directory."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    if "://" not in uri and uri:  # a bare path is a file store
        return str(Path(uri).resolve())
    return uri


def _best_val_loss(client, run_id: str) -> float | None:
    from mlflow.exceptions import MlflowException

    try:
        values = [m.value for m in client.get_metric_history(run_id, "val_loss")]
    except MlflowException:
        return None
    finite = [v for v in values if math.isfinite(v)]
    return min(finite) if finite else None


def _log_dataset_inputs(client, run_id: str, datasets: dict[str, str]) -> None:
    """Record each dataset as an input of the parent run before any trial starts.

    Besides saying what the grid ran on, this creates the dataset rows the trials' own
    ``log_input`` then finds: MLflow's SQL store checks for an existing (experiment, name,
    digest) row and inserts it if missing, so concurrent trials on one dataset race to insert
    the same row and all but one fail with a UNIQUE constraint error. Name, digest and source
    are the ones ``tracking.log_training_params`` uses.
    """
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    from schemas.manifest import Manifest

    inputs = []
    for data in dict.fromkeys(datasets.values()):
        manifest = Manifest.read(data)
        dataset = MetaDataset(
            source=resolve_dataset_source(str((Path(data) / "manifest.json").resolve())),
            name=f"{manifest.source}-{manifest.dataset_version}",
            digest=manifest.dataset_version,
        )
        tags = [InputTag(key=MLFLOW_DATASET_CONTEXT, value="training")]
        inputs.append(DatasetInput(dataset=dataset._to_mlflow_entity(), tags=tags))
    client.log_inputs(run_id, datasets=inputs)


def open_parent_run(tracking_uri: str, grid: str):
    """(MlflowClient, run id) of a new parent run for grid ``grid``."""
    from mlflow.tracking import MlflowClient

    from training import tracking
    from training.experiment import EXPERIMENT

    client = MlflowClient(tracking_uri)
    run = client.create_run(
        tracking.configure(tracking_uri, EXPERIMENT),
        run_name=f"grid-{grid}",
        tags={"mmlinks.grid": grid, "mmlinks.grid.role": "parent"},
    )
    return client, run.info.run_id


def log_grid_params(
    client, parent_id: str, spec: GridSpec, base_cfg: TrainConfig, datasets: dict, specs: list
) -> None:
    """The parent run's parameters and the trial list, before any trial starts."""
    from mlflow.entities import Param

    params = {
        "grid": spec.name,
        "datasets": json.dumps(datasets, sort_keys=True),
        "dataset_names": ",".join(datasets),
        "points": len(spec.points),
        "family": spec.family,
        "repeats": spec.repeats,
        "trials": len(specs),
        "b_values": ",".join(str(b) for b in sorted({point_b(p, base_cfg) for p in spec.points})),
        **{f"base.{k}": v for k, v in base_cfg.public_dict().items()},
        **{f"table.{k}": v for k, v in spec.base_overrides.items()},
    }
    client.log_batch(parent_id, params=[Param(k, str(v)[:500]) for k, v in params.items()])
    client.log_dict(
        parent_id, {"grid": spec.name, "datasets": datasets, "trials": specs}, "grid/trials_spec.json"
    )
    _log_dataset_inputs(client, parent_id, datasets)


def log_grid_result(client, parent_id: str, result: GridResult) -> None:
    """The table (markdown, text, JSON), the trials and the counts on the parent run."""
    from training.grid.render import format_table

    client.log_text(parent_id, format_table(result, markdown=True), "grid/table.md")
    client.log_text(parent_id, format_table(result), "grid/table.txt")
    client.log_dict(parent_id, result.table, "grid/table.json")
    client.log_dict(parent_id, {"trials": [asdict(t) for t in result.trials]}, "grid/trials.json")
    client.log_metric(parent_id, "failed_trials", len(result.failed))
    client.log_metric(parent_id, "ok_trials", len(result.trials) - len(result.failed))
    client.log_metric(parent_id, "seconds", result.seconds)
