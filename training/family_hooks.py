"""The families' hooks the core calls by name: how a run ends, how it is packaged, how a served
model is scored for promotion.

Each family's ``registration`` module fills these (``training.families``); the core looks a hook
up by a string it already holds and never imports a family:

- ``register_run_finish(family, finish)``: the end of a run of an objective whose
  ``ObjectiveSpec.family`` is ``family``, after training: its test evaluation, MLflow metrics and
  artifacts, the packaged and registered model and the report.
  ``training.experiment.run_experiment`` calls ``finish(cfg, manifest, run, result, tracking_uri,
  model_name, alias, report_dir) -> ExperimentResult``; a family without one ends as a link run
  does, in the core. (The retrieval family's finish also ends news runs: the ``news`` objective's
  family is "retrieval".)
- ``register_run_plan(objective, plan)``: how a run of ``objective`` is trained when it is more
  than one run (the news family's staged recipe: a nested run per stage under one parent run).
  ``training.experiment.run_experiment`` first calls ``plan(cfg, tracking_uri, model_name, alias,
  progress, report_dir, parent_run_id) -> ExperimentResult | None``; None: one run as usual (the
  plan's own stages come back that way).
- ``register_packager(packaging, package)``: the pyfunc of such a run whose
  ``ObjectiveSpec.packaging`` is ``packaging``, for a family whose finish packages another
  family's models (the retrieval finish, a "news-archive" news run):
  ``package(ckpt_dir, cfg, manifest, run, result, test_paths, refine) -> model URI``.
- ``register_served_evaluation(family, evaluate)``: the promotion gate's metrics of a served
  model whose pyfunc says ``family`` ("retrieval", "news"):
  ``training.registry.evaluate_model_uri`` calls ``evaluate(linker, paths) -> dict``; a model
  without one is scored as a link model (AUC, p@k) in the core.

No torch or MLflow at import time: the hooks import their family's code when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from training.families import load_families

_RUN_FINISHES: dict[str, Callable[..., Any]] = {}
_PACKAGERS: dict[str, Callable[..., str]] = {}
_RUN_PLANS: dict[str, Callable[..., Any]] = {}
_SERVED_EVALUATIONS: dict[str, Callable[[Any, list], dict]] = {}


def _register(hooks: dict, kind: str, key: str, hook: Callable, replace: bool) -> Callable:
    load_families()  # a hook registered by hand (a test) comes after the families' own
    if key in hooks and not replace:
        raise ValueError(f"{kind} {key!r} is already registered")
    hooks[key] = hook
    return hook


def register_run_finish(family: str, finish: Callable[..., Any], replace: bool = False) -> Callable:
    """How a run of an objective of ``family`` (``ObjectiveSpec.family``) ends after training."""
    return _register(_RUN_FINISHES, "run finish of family", family, finish, replace)


def run_finish(family: str) -> Callable[..., Any] | None:
    """The run finish of ``family``; None: the core's (a link run's)."""
    load_families()
    return _RUN_FINISHES.get(family)


def register_run_plan(objective: str, plan: Callable[..., Any], replace: bool = False) -> Callable:
    """How a run of ``objective`` is trained when its config asks for several stages."""
    return _register(_RUN_PLANS, "run plan of objective", objective, plan, replace)


def run_plan(objective: str) -> Callable[..., Any] | None:
    """The run plan of ``objective``; None: always one run."""
    load_families()
    return _RUN_PLANS.get(objective)


def register_packager(packaging: str, package: Callable[..., str], replace: bool = False) -> Callable:
    """How a run whose ``ObjectiveSpec.packaging`` is ``packaging`` is packaged as a pyfunc."""
    return _register(_PACKAGERS, "packager", packaging, package, replace)


def packager(packaging: str) -> Callable[..., str] | None:
    load_families()
    return _PACKAGERS.get(packaging)


def register_served_evaluation(
    family: str, evaluate: Callable[[Any, list], dict], replace: bool = False
) -> Callable:
    """How the promotion gate scores a served model whose pyfunc's ``family`` is ``family``."""
    return _register(_SERVED_EVALUATIONS, "served evaluation of family", family, evaluate, replace)


def served_evaluation(family: str) -> Callable[[Any, list], dict] | None:
    """The promotion gate's metrics of a served model of ``family``; None: a link model's."""
    load_families()
    return _SERVED_EVALUATIONS.get(family)
