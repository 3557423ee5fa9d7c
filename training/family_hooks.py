"""The families' hooks the core calls by name: how a run ends (``register_run_finish``) and how
it is planned (``register_run_plan``; a plan returning None means one run as usual).

Why hooks: the core looks a hook up by a string it holds and never imports a family; each
family's ``registration`` module fills them. No torch or MLflow at import time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from training.families import load_families

_RUN_FINISHES: dict[str, Callable[..., Any]] = {}
_RUN_PLANS: dict[str, Callable[..., Any]] = {}


def _register(hooks: dict, kind: str, key: str, hook: Callable, replace: bool) -> Callable:
    load_families()  # a hook registered by hand (a test) comes after the families' own
    if key in hooks and not replace:
        raise ValueError(f"{kind} {key!r} is already registered")
    hooks[key] = hook
    return hook


def register_run_finish(family: str, finish: Callable[..., Any], replace: bool = False) -> Callable:
    """How a run of an objective of ``family`` (``ObjectiveSpec.family``) ends after training:
    ``finish(cfg, manifest, run, result, tracking_uri, model_name, alias, report_dir, package)
    -> ExperimentResult`` (``package``: the run's ``training.experiment.Packager``)."""
    return _register(_RUN_FINISHES, "run finish of family", family, finish, replace)


def run_finish(family: str) -> Callable[..., Any] | None:
    """The run finish of ``family``; None: the core's (a link run's)."""
    load_families()
    return _RUN_FINISHES.get(family)


def register_run_plan(objective: str, plan: Callable[..., Any], replace: bool = False) -> Callable:
    """How a run of ``objective`` is trained when its config asks for several stages: ``plan(cfg,
    tracking_uri, model_name, alias, progress, report_dir, parent_run_id, package) ->
    ExperimentResult | None``."""
    return _register(_RUN_PLANS, "run plan of objective", objective, plan, replace)


def run_plan(objective: str) -> Callable[..., Any] | None:
    """The run plan of ``objective``; None: always one run."""
    load_families()
    return _RUN_PLANS.get(objective)
