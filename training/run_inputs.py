"""What a training run reads once, before anything heavy loads: the dataset's manifest, the
validated config, every shard path by split (checked against the manifest and its schema
version), the objective's registered spec and where the run's checkpoints go.

``mmlinks train`` reads it (its errors are one line, before torch, Ray or MLflow load) and
hands it to ``run_experiment``, which hands it to ``training.driver.fit``; the manifest is not
read again, nor the objective looked up again, by any stage of the run. Called with a bare
``TrainConfig`` (the demo, a job, Dagster, a grid trial), those read it first themselves.
No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from schemas.manifest import Manifest
from schemas.shards import check_shards
from training.config import TrainConfig
from training.objectives.registry import ObjectiveSpec, check_objective_data


@dataclass
class RunInputs:
    """A run's config and what it read once from its dataset (shard paths absolute, as Ray
    workers on another node or directory need them). (Not the backbone: a choice,
    ``BackboneSpec.choose``, may replace it.)"""

    cfg: TrainConfig  # as given; the driver's copy holds an absolute data path
    manifest: Manifest
    train_paths: list[str]
    val_paths: list[str]
    test_paths: list[str]
    # where the run's checkpoints go: --storage-path, else ray_results next to the dataset
    # ("" for a dataset at a URI without --storage-path)
    storage: str
    objective: ObjectiveSpec
    train_limit: int | None = None  # --workers 0 reads only the first training documents


def read_inputs(cfg: TrainConfig) -> RunInputs:
    """The manifest, the config's own rules, the shards and what the objective needs of the
    dataset, checked in that order, each failure one line (``MmlinksError``)."""
    manifest = Manifest.read(cfg.data)
    cfg.validate()
    data = cfg.data if "://" in cfg.data else str(Path(cfg.data).resolve())
    paths = manifest.shard_paths(data)  # each verified against the manifest, once
    check_shards(paths)  # schema versions, before a run is opened
    objective = check_objective_data(cfg, manifest)
    split_of = {"train": [], "val": [], "test": []}
    for info, path in zip(manifest.shards, paths, strict=True):
        split_of.setdefault(info.split, []).append(str(path))
    storage = cfg.storage_path or (str(Path(data).parent / "ray_results") if "://" not in data else "")
    return RunInputs(
        cfg,
        manifest,
        split_of["train"],
        split_of["val"],
        split_of["test"],
        storage,
        objective,
    )
