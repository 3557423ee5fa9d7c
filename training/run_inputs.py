"""What a training run reads once, before anything heavy loads (manifest, validated config,
shard paths, objective spec, checkpoint storage, run key), so no stage reads it again and
``mmlinks train``'s errors are one line before torch, Ray or MLflow load. No torch here."""

from __future__ import annotations

import hashlib
import re
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
    # the config as the run's records show it (``TrainConfig.public_dict``: no hosts or keys)
    params: dict
    # the tag value naming the run's Ray Train run across the commands that train it ("": no
    # --run-name); ``training.tracking`` finds and claims its MLflow runs by it
    resume_key: str = ""
    train_limit: int | None = None  # --workers 0 reads only the first training documents


def read_inputs(cfg: TrainConfig) -> RunInputs:
    """What ``cfg``'s run reads once: the manifest, the config's own rules, what the objective
    needs of the dataset and the shards, checked in that order, each failure one line
    (``MmlinksError``)."""
    data = cfg.data if "://" in cfg.data else str(Path(cfg.data).resolve())
    storage = cfg.storage_path or (str(Path(data).parent / "ray_results") if "://" not in data else "")
    key = resume_key(cfg.run_name, storage) if cfg.run_name else ""
    manifest = Manifest.read(cfg.data)
    params = cfg.public_dict()
    cfg.validate()
    objective = check_objective_data(cfg, manifest)
    paths = manifest.shard_paths(data)  # each verified against the manifest, once
    check_shards(paths)  # schema versions, before a run is opened
    split_of = {"train": [], "val": [], "test": []}
    for info, path in zip(manifest.shards, paths, strict=True):
        split_of.setdefault(info.split, []).append(str(path))
    return RunInputs(
        cfg,
        manifest,
        split_of["train"],
        split_of["val"],
        split_of["test"],
        storage,
        objective,
        params,
        key,
    )


def resume_key(run_name: str, storage: str) -> str:
    """What identifies one Ray Train run across the commands that train it: its run name (only
    its word characters, readable in the UI) and a hash of the name and the storage path (the
    path may name a bucket or host: it is never logged). Nothing in it can break the quoted
    search filter of ``close_abandoned_runs``, whatever the user named the run. A local
    ``storage`` counts by its absolute path."""
    if "://" not in storage:
        storage = str(Path(storage).resolve())
    digest = hashlib.sha256(f"{run_name}\0{storage.rstrip('/')}".encode()).hexdigest()[:16]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', run_name)[:60]}@{digest}"
