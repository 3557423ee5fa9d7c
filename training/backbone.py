"""The backbone registry: the one module that defines every ``--backbone`` name.

Why checkpoints store the model config with its ``backbone`` key: loading code rebuilds the
right class without the training flags (``build_model``). No torch at import time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    from torch import nn


from training.families import load_families

# the callbacks' config: a training.config.TrainConfig, not imported (config reads this registry)
TrainConfig = Any

DEFAULT_BACKBONE = "gru"  # what a model config without a "backbone" key was trained with


@dataclass(frozen=True)
class BackboneSpec:
    name: str
    summary: str
    # (cfg, manifest, vocab_size, word_dim, train_paths) -> the model config dict
    model_config: Callable[..., dict]
    # (model config dict, embeddings, feature_stats) -> nn.Module with encode(batch)
    build: Callable[..., Any]
    # reads per-image region features (and their labels as concept tokens of the vocabulary)
    needs_regions: bool = False
    # serves requests that carry only global image features (the packaged model's example)
    feature_only_requests: bool = True
    check: Callable[[TrainConfig], list[str]] | None = None
    # how `mmlinks evaluate` scores a model of this backbone: "links" (AUC, p@1, p@5 per
    # document), "pairs" (text-to-image MedR and R@K over pools, with refinement and the HTML
    # report: training/retrieval/report.py) or "news" (R@K and MedR over news samples)
    evaluation: str = "links"
    # (the trained model) -> the run's warnings about it, logged on the MLflow run by the hook
    # (news: the training texts cut by --news-max-tokens); None: none. Read by the run finishes
    # that take it (the retrieval family's, training/retrieval/experiment.py)
    run_warnings: Callable[[Any], list[str]] | None = None
    # settings this backbone chooses by measuring the corpus before the run (the gru backbone's
    # image side, issue #60): (cfg, train paths, val paths, trial, saved config, jobs) -> an object
    # with ``overrides`` (TrainConfig fields), ``summary()`` and ``to_dict()``, or None when the
    # config names them; ``trial`` trains a candidate briefly (``training.driver.train_trial``),
    # ``saved`` is a resumed run's config, whose choice is kept; ``jobs`` candidates train at once
    choose: Callable[..., Any] | None = None


_BACKBONES: dict[str, BackboneSpec] = {}


def register_backbone(spec: BackboneSpec, replace: bool = False) -> BackboneSpec:
    load_families()  # a spec registered by hand (a test) comes after the families' own
    if spec.name in _BACKBONES and not replace:
        raise ValueError(f"backbone {spec.name!r} is already registered")
    _BACKBONES[spec.name] = spec
    return spec


def backbone_names() -> tuple[str, ...]:
    load_families()
    return tuple(_BACKBONES)


def get_backbone(name: str) -> BackboneSpec:
    load_families()
    if name not in _BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; known: {', '.join(_BACKBONES)}")
    return _BACKBONES[name]


def build_model(
    model_cfg: dict,
    embeddings: np.ndarray | None = None,
    feature_stats: tuple[np.ndarray, np.ndarray] | None = None,
) -> nn.Module:
    return get_backbone(model_cfg.get("backbone", DEFAULT_BACKBONE)).build(
        model_cfg, embeddings, feature_stats
    )


def unwrap(model):
    """The module inside a DDP wrapper (or the model itself)."""
    return model.module if hasattr(model, "module") else model


def optimizer_groups(model, lr: float) -> list:
    """The optimizer's parameter groups of a built model: its own when it has some (a pretrained
    encoder's blocks at a lower rate, ``training/link/pretrained.py``), else every parameter at
    ``lr``."""
    net = unwrap(model)
    if hasattr(net, "param_groups"):
        return net.param_groups(lr)
    return [{"params": list(model.parameters())}]


def needs_regions(model_cfg: dict) -> bool:
    return get_backbone(model_cfg.get("backbone", DEFAULT_BACKBONE)).needs_regions


def only_its_objectives(name: str) -> Callable[[TrainConfig], list[str]]:
    """The check of a backbone that only its own objectives train (those whose
    ``ObjectiveSpec.backbone`` is ``name``), e.g. "backbone (news trains only --objective news)"."""

    def check(cfg: TrainConfig) -> list[str]:
        from training.objectives.registry import get_objective, objective_names

        own = [o for o in objective_names() if get_objective(o).backbone == name]
        if cfg.objective in own:
            return []
        if not own:
            return [f"backbone ({name}: no registered objective trains it)"]
        listed = own[-1] if len(own) == 1 else f"{', '.join(own[:-1])} or {own[-1]}"
        return [f"backbone ({name} trains only --objective {listed})"]

    return check
