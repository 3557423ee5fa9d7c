"""A registered link model for the linking tests, made without training: a small MulLink with
seeded weights and the dataset's feature statistics, packaged by ``models.packaging`` and
registered in a real MLflow SQLite store with the params a training run logs (extractor, schema
version). Its links are not good ones; the tests check the job, not the model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

NAME = "link-test"


def read_links(paths: list) -> pa.Table:
    """Link shards as one table, refusing files that are not link shards of this version."""
    from schemas.errors import MmlinksError
    from schemas.links import LINKS_SCHEMA_NAME, LINKS_SCHEMA_VERSION, link_schema

    tables = []
    for p in paths:
        table = pq.read_table(p)
        meta = table.schema.metadata or {}
        if meta.get(b"mmlinks.schema") != LINKS_SCHEMA_NAME.encode() or meta.get(b"mmlinks.version") != b"1":
            raise MmlinksError(f"{p} is not an mmlinks link shard of version {LINKS_SCHEMA_VERSION}")
        tables.append(table)
    return pa.concat_tables(tables) if tables else link_schema().empty_table()


def write_checkpoint(folder: Path, vocab, image_dim: int, seed: int, features=None) -> Path:
    import numpy as np
    import torch

    from training.backbone import build_model

    torch.manual_seed(seed)
    cfg = {"vocab_size": len(vocab), "word_dim": 16, "image_dim": image_dim, "d_multi": 16, "backbone": "gru"}
    stats = None if features is None else (features.mean(0), np.maximum(features.std(0), 1e-3))
    model = build_model(cfg, None, stats).eval()
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"model": model.state_dict(), "epoch": 0, "val_loss": 0.0, "best_epoch": 0}, folder / "state.pt"
    )
    (folder / "meta.json").write_text(json.dumps({"model": cfg, "train": {"max_tokens": 20}}))
    vocab.save(folder / "vocab.json")
    return folder


def register_model(
    workdir: Path, dataset: Path, seed: int, alias: str | None = "production", name: str = NAME, **params
) -> str:
    """Log and register a seeded model trained on nothing; returns its version."""
    import mlflow
    import numpy as np
    from mlflow.tracking import MlflowClient

    from models.packaging import log_link_model
    from schemas.manifest import Manifest
    from schemas.shards import read_table
    from training.data import features_of
    from training.text import Vocabulary
    from training.tracking import configure

    manifest = Manifest.read(dataset)
    table = read_table(manifest.shard_paths(dataset, "train"), ["sentences", "images"])
    vocab = Vocabulary.build([s for doc in table.column("sentences").to_pylist() for s in doc], min_count=1)
    feats = np.concatenate(features_of(table)[0])
    dim = int(params.pop("image_dim", manifest.feature_extractor.dim))
    ckpt = write_checkpoint(
        workdir / f"ckpt-{seed}", vocab, dim, seed, feats if dim == feats.shape[1] else None
    )
    uri = f"sqlite:///{workdir / 'mlflow.db'}"  # what `--workdir` names (a set MLFLOW_TRACKING_URI would win)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)  # else an earlier test's registry may still be the default
    mlflow.set_experiment(experiment_id=configure(uri, "link-tests"))
    logged = {
        "feature_extractor": f"{manifest.feature_extractor.name}@{manifest.feature_extractor.version}",
        "schema_version": str(manifest.schema_version),
        **params,
    }
    with mlflow.start_run(run_name=f"seed-{seed}"):
        mlflow.log_params(logged)
        model_uri = log_link_model(
            str(ckpt),
            vocab,
            extractor=manifest.feature_extractor.name,
            extractor_version=manifest.feature_extractor.version,  # as run_experiment passes it
        )
    version = str(mlflow.register_model(model_uri, name).version)
    if alias:
        MlflowClient(uri).set_registered_model_alias(name, alias, version)
    mlflow.set_tracking_uri(None)
    mlflow.set_registry_uri(None)
    # set_registry_uri(None) leaves the MLFLOW_REGISTRY_URI it exported: later tests in this worker
    # would register into this store (it broke the grid and PostgreSQL-server tests)
    os.environ.pop("MLFLOW_REGISTRY_URI", None)
    return version


@pytest.fixture(scope="session")
def link_workdir(dataset, tmp_path_factory) -> Path:
    """An MLflow store (``WORKDIR/mlflow.db``) with version 1 of ``link-test`` as production."""
    workdir = tmp_path_factory.mktemp("link-mlflow")
    register_model(workdir, dataset, seed=0)
    return workdir


@pytest.fixture(autouse=True)
def _no_leftover_tracking_uri(monkeypatch):
    """`mmlinks evaluate` run in-process exports its store as MLFLOW_TRACKING_URI (MLflow's
    set_tracking_uri does), which would win over the next test's --workdir."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
