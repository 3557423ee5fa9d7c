"""MLflow tracking and registry: where runs, metrics and models go.

Default store is a local SQLite file (no server); ``MLFLOW_TRACKING_URI`` overrides it, so the
same code logs to a tracking server on a cluster. Credentials for a server come only from the
environment (MLFLOW_TRACKING_TOKEN etc.), which MLflow reads itself; nothing here logs them.
"""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from schemas.manifest import Manifest
from training.config import TrainConfig


def tracking_uri(workdir: str | Path) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{(Path(workdir) / 'mlflow.db').resolve()}"


def configure(uri: str, experiment: str) -> str:
    """Point MLflow at ``uri`` and make sure the experiment exists; returns its id."""
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        artifact_location = None
        if uri.startswith("sqlite:///"):  # keep artifacts next to the local database
            artifact_location = (Path(uri[len("sqlite:///") :]).parent / "mlartifacts").resolve().as_uri()
        return client.create_experiment(experiment, artifact_location=artifact_location)
    return exp.experiment_id


def log_training_params(cfg: TrainConfig, manifest: Manifest) -> None:
    params = {k: v for k, v in cfg.to_dict().items() if k not in ("ray_address",)}
    params.update(
        {
            "dataset_version": manifest.dataset_version,
            "dataset_source": manifest.source,
            "feature_extractor": f"{manifest.feature_extractor.name}@{manifest.feature_extractor.version}",
            "schema_version": manifest.schema_version,
        }
    )
    mlflow.log_params({k: str(v)[:500] for k, v in params.items()})


def register(model_uri: str, name: str, alias: str | None, uri: str) -> str:
    """Register ``model_uri`` under ``name`` and point ``alias`` at the new version."""
    version = mlflow.register_model(model_uri, name)
    if alias:
        MlflowClient(uri).set_registered_model_alias(name, alias, version.version)
    return str(version.version)
