"""The objective registry: the one module that defines every ``--objective`` name.

Why one registry: config validation, run labels, the loop, the report and the grid all read these
specs, so adding an objective is one ``register_objective(ObjectiveSpec(...))`` call in its
family. No torch at import time (``training.config`` reads it)."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from training.data import DocBatch

from training.families import load_families

# the callbacks' config: a training.config.TrainConfig, not imported (config reads this registry)
TrainConfig = Any

DEFAULT_OBJECTIVE = "ap"  # Hessel et al. 2019's best (assignment); TrainConfig's default

# loss(s_pad, s_mask, v_pad, v_mask, cfg, generator) -> (loss, {part name: float})
LossFn = Callable[..., tuple[Any, dict[str, float]]]


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    summary: str  # one line for --help and docs
    similarity: str  # the document similarity it trains (a key of similarity.SIMILARITIES)
    loss: LossFn
    label: Callable[[TrainConfig], str]  # run name / table label, e.g. ap-full-hard
    # TrainConfig fields the objective reads beyond the shared ones (margin, batch_docs, ...);
    # "k" here means the k mode applies (the grid folds k into "full" otherwise).
    fields: tuple[str, ...] = ("negatives",)
    # (pyarrow table, rng or None) -> table, applied before encoding (None = the batch as is);
    # validation passes rng=None for a draw fixed by document id.
    prepare: Callable[[Any, Any], Any] | None = None
    # the named loss parts the config selects (logged as train_loss_<part> when > 1)
    parts: Callable[[TrainConfig], tuple[str, ...]] = lambda cfg: ("C",)
    # extra validation: the names of the config's invalid settings for this objective
    check: Callable[[TrainConfig], list[str]] | None = None
    # one line for the report: what was trained
    describe: Callable[[TrainConfig], str] | None = None
    # the paper's row name in the grid tables ("" = not one of the paper's rows): Hessel et al.
    # 2019's Tables 2, 3 and S1-S4 (family "link", ``training/grid/rows.py``) or Alikhani et al.'s
    # Tables 4 and 5 (family "retrieval", ``training/grid/retrieval.py``: "CMCM" + "_Action" for a
    # per-relation model); and which negatives the main-paper Tables 2 and 3 print for a link
    # objective (the supplement prints both)
    table_name: str = ""
    main_negatives: str = "hard"
    # Alikhani et al.'s ablation rows of this objective in Tables 4 and 5: TrainConfig overrides,
    # each a row of its own printed before the objective's (CMCM-NoAttn: retrieval_pooling mean)
    ablations: tuple[dict, ...] = ()
    # "link" (documents, Hessel/Li) or "retrieval" (text-image pairs, Alikhani et al.)
    family: str = "link"
    # the backbone this objective trains whatever --backbone says (None: --backbone)
    backbone: str | None = None
    # (model, batch, cfg, generator) -> (loss, parts): replaces ``loss`` on the padded
    # encodings, for objectives whose model has more than the two encoders (CMCM's CAM)
    model_loss: Callable[..., tuple[Any, dict[str, float]]] | None = None
    # (model, validation DocBatches, cfg) -> extra per-epoch validation metrics (val_medr)
    val_metrics: Callable[..., dict[str, float]] | None = None
    # one model per coherence relation (CMCM_c): the objective takes --relation, which names its
    # model (``default_model_name``) and its grid row; every other objective refuses --relation
    per_relation: bool = False
    # trains on coherence-labelled pair datasets (a manifest with "relations"; Alikhani et al.):
    # its default model names are the ones a promote/rollback considers for such a dataset, and
    # only for it
    needs_relations: bool = False
    # the model has Alikhani et al.'s Coherence Aware Module (a relation classifier trained beside
    # retrieval, loss part "cls"): it predicts --relation (per_relation) or every relation
    cam: bool = False
    # shard columns the objective reads beyond the training ones
    columns: tuple[str, ...] = ()
    # False: the model encodes ONE text per document from its several sentences (news samples:
    # headline, lead, body, caption fused), so the per-sentence link scores of validation
    # (AUC, within-document gap) do not apply and are skipped
    link_metrics: bool = True
    # how a run is packaged as an MLflow pyfunc (a key of ``PACKAGINGS``): "link" (documents ->
    # link matrix, models/packaging.py), "pairs" (text -> ranked test-split gallery,
    # models/retrieval_serving.py; the test split must be pairs), "news-archive" (article ->
    # ranked archive images through a FAISS index, models/news_serving.py), "none" (evaluated
    # and logged, not packaged)
    packaging: str = "link"
    # (manifest, dataset folder) -> what the dataset lacks for this objective (checked before a
    # run is opened, so `mmlinks train` fails in one line instead of inside a Ray worker)
    check_data: Callable[[Any, str], list[str]] | None = None
    # TrainConfig values this objective trains with where TrainConfig's own defaults (a full run
    # of Hessel et al.'s linking) do not suit it: applied under the flags and settings given,
    # and not under --preset paper (``training.config.preset_values``)
    train_defaults: tuple[tuple[str, Any], ...] = ()

    def text(self, cfg: TrainConfig) -> str:
        if self.describe is not None:
            return self.describe(cfg)
        return f"{self.name} k={cfg.k} negatives={cfg.negatives} backbone={cfg.backbone}"

    @property
    def uses_k(self) -> bool:
        return "k" in self.fields


def lazy(module: str, name: str) -> Callable:
    """``module.name``, imported when first called: how a family's registration names its code
    without importing torch (the registries load at ``--help`` time)."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    return call


def unused_loss(*args, **kwargs):
    """``ObjectiveSpec.loss`` of an objective whose ``model_loss`` replaces it: never called."""
    raise NotImplementedError("this objective's model_loss replaces its loss")


_OBJECTIVES: dict[str, ObjectiveSpec] = {}
PACKAGINGS = ("link", "pairs", "news-archive", "none")


def register_objective(spec: ObjectiveSpec, replace: bool = False) -> ObjectiveSpec:
    """Add ``spec`` to the registry (``replace`` to redefine a name, e.g. in a test)."""
    load_families()  # a spec registered by hand (a test) comes after the families' own
    if spec.packaging not in PACKAGINGS:
        raise ValueError(f"objective {spec.name!r}: packaging {spec.packaging!r} is not one of {PACKAGINGS}")
    if spec.name in _OBJECTIVES and not replace:
        raise ValueError(f"objective {spec.name!r} is already registered")
    _OBJECTIVES[spec.name] = spec
    return spec


def adopt_objective(spec: ObjectiveSpec) -> ObjectiveSpec:
    """``spec`` registered in this process unless its name is: a Ray worker or a candidate's
    process adopts the driver's objective, which may have been registered only there (a plug-in,
    a test module), so the config's lookups answer as they did in the driver."""
    if spec.name not in objective_names():
        register_objective(spec)
    return spec


def unregister_objective(name: str) -> None:
    load_families()
    _OBJECTIVES.pop(name, None)


def check_objective_data(cfg: TrainConfig, manifest) -> ObjectiveSpec:
    """The objective's spec; a dataset it cannot train on (``ObjectiveSpec.check_data``) refused
    in one line, before anything heavy is imported or a run is opened."""
    spec = get_objective(cfg.objective)
    problems = spec.check_data(manifest, cfg.data) if spec.check_data else []
    if problems:
        from schemas.errors import MmlinksError

        raise MmlinksError(f"--objective {cfg.objective}: {'; '.join(problems)}")
    return spec


def objective_names() -> tuple[str, ...]:
    load_families()
    return tuple(_OBJECTIVES)


def relation_objectives() -> tuple[str, ...]:
    """The objectives that take ``--relation`` (``ObjectiveSpec.per_relation``)."""
    load_families()
    return tuple(name for name, spec in _OBJECTIVES.items() if spec.per_relation)


def relation_problems(objective: str, relation: str) -> list[str]:
    """What is wrong with ``relation`` for ``objective``, as TrainConfig validation words it: a
    per-relation objective needs one, every other objective takes none. The one rule behind
    TrainConfig's check and ``mmlinks promote --objective/--relation``."""
    if get_objective(objective).per_relation:
        return [] if relation else [f"relation ({objective} trains one model per relation: --relation NAME)"]
    return [f"relation (only {' or '.join(relation_objectives())} takes one)"] if relation else []


def default_model_name(objective: str, relation: str = "") -> str:
    """The registered-model name a run of ``objective`` gets unless told otherwise, e.g.
    ``mmlinks-ap``, ``mmlinks-cmcm``, ``mmlinks-cmcm-c-Action`` (CMCM_c: one model per relation).
    The one rule: ``mmlinks train``, a Ray job and ``mmlinks promote`` all name models by it."""
    return f"mmlinks-{objective}" + (f"-{relation}" if relation else "")


def get_objective(name: str) -> ObjectiveSpec:
    load_families()
    try:
        return _OBJECTIVES[name]
    except KeyError:
        from schemas.errors import MmlinksError

        raise MmlinksError(f"unknown objective {name!r}; known: {', '.join(_OBJECTIVES)}") from None


# ------------------------------------------------------------------- the loss of a batch


def padded(model, batch: DocBatch):
    from training.data import pad_documents

    s, v = model(batch)  # through forward: under DDP that is what syncs the gradients
    s_pad, s_mask = pad_documents(s, batch.n_sentences)
    v_pad, v_mask = pad_documents(v, batch.n_images)
    return s_pad, s_mask, v_pad, v_mask


def objective_loss(
    model,
    batch: DocBatch,
    cfg: TrainConfig,
    generator: torch.Generator | None = None,
    spec: ObjectiveSpec | None = None,
    epoch: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, its named parts) for ``cfg.objective``; ``generator`` drives the random
    sub-documents of li2021 (a fixed one on validation batches keeps that loss comparable).
    ``spec`` overrides the registry lookup (a Ray worker gets the driver's spec)."""
    spec = spec or get_objective(cfg.objective)
    if spec.model_loss is not None:  # ``epoch``: the retrieval objectives' hard-negative warm-up
        return spec.model_loss(model, batch, cfg, generator, epoch=epoch)
    if epoch is not None and epoch < cfg.negatives_warmup and cfg.negatives != "mean":
        cfg = copy.copy(cfg)  # no re-validation per step: only the pooling changes
        cfg.negatives = "mean"
    return spec.loss(*padded(model, batch), cfg, generator)
