"""Which model class a config names: the one place that maps ``backbone`` to a module.

Checkpoints store the model config dict with its ``backbone`` key, so loading code (evaluation,
packaging, resume) rebuilds the right class without knowing the training flags.
"""

from __future__ import annotations

import numpy as np
from torch import nn


def build_model(
    model_cfg: dict,
    embeddings: np.ndarray | None = None,
    feature_stats: tuple[np.ndarray, np.ndarray] | None = None,
) -> nn.Module:
    kind = model_cfg.get("backbone", "gru")
    if kind == "gru":
        from training.model import ModelConfig, MulLink

        return MulLink(ModelConfig(**model_cfg), embeddings, feature_stats)
    if kind == "transformer":
        from training.transformer import TransformerConfig, TransformerLink

        return TransformerLink(TransformerConfig(**model_cfg), embeddings, feature_stats)
    raise ValueError(f"unknown backbone {kind!r}; known: gru, transformer")


def needs_regions(model_cfg: dict) -> bool:
    return model_cfg.get("backbone", "gru") == "transformer"
