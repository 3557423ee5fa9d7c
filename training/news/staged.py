"""The news family's default recipe (issue #46): Liu et al.'s divide and conquer in one
``mmlinks train --objective news`` command (docs/retrieval-news.md).

Why the default: on every synthetic corpus measured, the fused model beats one trained jointly
(docs/benchmarks-news.md). Each stage is a ``run_experiment`` under one MLflow parent run; the
stages' checkpoints come back through MLflow, so a remote tracking server works too."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.news import parse_sources
from training.news.config import drop_rate, staged_recipe

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig
    from training.experiment import ExperimentResult

RECIPE_TAG, STAGE_TAG = "mmlinks.news.recipe", "mmlinks.news.stage"


def stage_order(cfg: TrainConfig, present: set[str] | None = None) -> list[str]:
    """The single-source stages: caption first (divide and conquer takes the word embeddings and
    the image tower from the first listed; the paper's best single source), then as given; only
    the sources in ``present`` (the ones some training article has) when given."""
    order = sorted(parse_sources(cfg.news_sources), key=lambda s: s != "caption")
    return [s for s in order if present is None or s in present]


def sources_in_data(data: str, manifest) -> set[str]:
    """The sources some training article has (its metadata's ``news_sources``), from the metadata
    column of every train shard: a source no article has would train a single-source model on
    nothing (a dataset built from headline + caption, under the four-source default)."""
    from schemas.news import NEWS_SOURCES, SOURCES_KEY
    from schemas.shards import read_table

    wanted = set(NEWS_SOURCES)
    found: set[str] = set()
    for path in manifest.shard_paths(data, "train"):  # one shard at a time; stop once all are seen
        for meta in read_table([path], columns=["metadata"]).column("metadata"):
            found.update(s.strip() for s in str(dict(meta.as_py() or {}).get(SOURCES_KEY, "")).split(","))
        if wanted <= found:
            break
    return found - {""}


def _stage_name(cfg: TrainConfig, stage: str) -> str:
    """A stage's ``--run-name`` (its Ray Train storage and resume key): the parent's plus the stage."""
    return f"{cfg.run_name}-{stage}" if cfg.run_name else ""


def single_stage(cfg: TrainConfig, source: str) -> TrainConfig:
    """Stage 1's config for ``source``: one source, complete inputs, nothing loaded."""
    return dataclasses.replace(
        cfg,
        news_sources=source,
        random_drop=0.0,
        init_from="",
        fuser_warmup_epochs=0,
        news_recipe="joint",
        run_name=_stage_name(cfg, source),
    )


def fusion_stage(cfg: TrainConfig, checkpoints: dict[str, str]) -> TrainConfig:
    """Stage 2's config: the fused model from the single-source checkpoints (in ``stage_order``),
    the fuser alone first, random_drop on. A source without a checkpoint (none in the data)
    keeps a fresh encoder."""
    warmup = cfg.fuser_warmup_epochs if cfg.fuser_warmup_epochs >= 0 else 1
    return dataclasses.replace(
        cfg,
        init_from=",".join(f"{s}={checkpoints[s]}" for s in stage_order(cfg) if s in checkpoints),
        random_drop=drop_rate(cfg),
        fuser_warmup_epochs=warmup,
        news_recipe="joint",
        run_name=_stage_name(cfg, "fusion"),
    )


def _open_parent(
    client, cfg: TrainConfig, manifest, tracking_uri: str, parent_run_id: str | None, stages: list[str]
) -> str:
    from mlflow.entities import Param

    from training import tracking
    from training.experiment import EXPERIMENT

    tags = {RECIPE_TAG: "staged", STAGE_TAG: "parent", "mmlinks.dataset_version": manifest.dataset_version}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    experiment = tracking.configure(tracking_uri, EXPERIMENT)
    run = client.create_run(experiment, run_name=f"{cfg.label}-staged", tags=tags)
    params = {
        **cfg.public_dict(),
        "dataset_version": manifest.dataset_version,
        "stages": ",".join([*stages, "fusion"]),
    }
    client.log_batch(run.info.run_id, params=[Param(k, str(v)[:500]) for k, v in params.items()])
    return run.info.run_id


def run_staged(
    cfg: TrainConfig,
    tracking_uri: str,
    model_name: str | None,
    alias: str | None,
    progress: bool = False,
    report_dir=None,
    parent_run_id: str | None = None,
    package=None,
) -> ExperimentResult | None:
    """The staged recipe of ``cfg`` (the ``news`` objective's run plan); None when ``cfg`` is
    one run (``staged_recipe``): a single source, ``--init-from``, a multilingual recipe or
    ``--news-recipe joint``. The result is the fusion stage's, with the parent run's ID. Each
    stage is packaged by ``package`` (``training.experiment.Packager``), as the one run would be."""
    if not staged_recipe(cfg):
        return None
    from mlflow.tracking import MlflowClient

    from schemas.manifest import Manifest
    from schemas.shards import check_shards
    from training.experiment import run_experiment
    from training.grid.init_grid import logged_checkpoint
    from training.objectives.registry import check_objective_data

    manifest = Manifest.read(cfg.data)
    cfg.validate()
    check_shards(manifest.shard_paths(cfg.data))  # refuse bad shards before a run is opened
    check_objective_data(cfg, manifest)
    stages = stage_order(cfg, sources_in_data(cfg.data, manifest))
    if not stages:
        from schemas.errors import MmlinksError

        raise MmlinksError(f"no training article of {cfg.data} has any of --news-sources {cfg.news_sources}")
    client = MlflowClient(tracking_uri)
    parent = _open_parent(client, cfg, manifest, tracking_uri, parent_run_id, stages)
    status = "FAILED"
    try:
        with tempfile.TemporaryDirectory(prefix="news-staged-") as tmp:
            checkpoints = {}
            for source in stages:
                res = run_experiment(
                    single_stage(cfg, source),
                    tracking_uri,
                    None,
                    None,
                    progress,
                    report_dir,
                    parent,
                    package=package,
                )
                client.set_tag(res.run_id, STAGE_TAG, f"single:{source}")
                folder = logged_checkpoint(client, client.get_run(res.run_id), Path(tmp) / source)
                checkpoints[source] = str(folder.resolve())
            final = run_experiment(
                fusion_stage(cfg, checkpoints),
                tracking_uri,
                model_name,
                alias,
                progress,
                report_dir,
                parent,
                package=package,
            )
        client.set_tag(final.run_id, STAGE_TAG, "fusion")
        client.set_tag(parent, "mmlinks.news.final_run", final.run_id)
        if final.model_version:
            client.set_tag(parent, "mmlinks.news.model_version", final.model_version)
        metrics = client.get_run(final.run_id).data.metrics
        for key, value in metrics.items():
            if key.startswith(("test_", "best_epoch")):
                client.log_metric(parent, key, value)
        status = "FINISHED"
    finally:
        client.set_terminated(parent, status)
    return dataclasses.replace(final, parent_run_id=parent)
