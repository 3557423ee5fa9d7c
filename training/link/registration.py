"""The link family's registrations: the Hessel et al. 2019 objectives (NoStruct, DC, TK, AP),
Li et al. 2021's, and the GRU and Transformer backbones, added to the core's registries
(``training.families`` loads this module on the first registry lookup). No torch at import time:
the losses and models import their tensor code when called."""

from __future__ import annotations

from typing import TYPE_CHECKING

from training.backbone import BackboneSpec, register_backbone
from training.link.li2021_parts import LI2021_PARTS
from training.objectives.registry import LossFn, ObjectiveSpec, lazy, register_objective

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig


# ------------------------------------------------------------------------------- the losses


def hessel_loss(s_pad, s_mask, v_pad, v_mask, cfg: TrainConfig, generator=None, similarity: str = "dc"):
    """The Hessel 2019 cross-document in-batch hinge on ``similarity``."""
    from training.link.loss import in_batch_loss
    from training.link.similarity import document_similarity

    sims = document_similarity(similarity, s_pad, s_mask, v_pad, v_mask, cfg.k)
    loss = in_batch_loss(sims, cfg.margin, cfg.negatives)
    return loss, {"C": float(loss.detach())}


def _hessel(similarity: str) -> LossFn:
    def loss(s_pad, s_mask, v_pad, v_mask, cfg, generator=None):
        return hessel_loss(s_pad, s_mask, v_pad, v_mask, cfg, generator, similarity)

    return loss


def _li2021_loss(s_pad, s_mask, v_pad, v_mask, cfg: TrainConfig, generator=None):
    from training.link.li2021 import li2021_loss

    return li2021_loss(
        s_pad,
        s_mask,
        v_pad,
        v_mask,
        parts=li2021_parts(cfg),
        margin=cfg.margin,
        negatives=cfg.negatives,
        sub_fraction=cfg.sub_fraction,
        generator=generator,
    )


def li2021_parts(cfg: TrainConfig) -> tuple[str, ...]:
    return tuple(p.strip() for p in cfg.objectives.split("+"))


def _li2021_check(cfg: TrainConfig) -> list[str]:
    parts = li2021_parts(cfg)
    bad = []
    if not ("C" in parts and set(parts) <= set(LI2021_PARTS) and len(set(parts)) == len(parts)):
        bad.append("objectives (C, C+I, C+D or C+I+D)")
    if cfg.k != "full":
        bad.append("k (li2021 uses TK with k = full, Li et al. 2021)")
    return bad


register_objective(
    ObjectiveSpec(
        name="nostruct",
        summary="NoStruct: DC on one random sentence and one random image per document",
        similarity="dc",
        loss=_hessel("dc"),
        label=lambda cfg: f"nostruct-{cfg.negatives}",
        prepare=lazy("training.data", "one_pair_per_document"),
        table_name="NoStruct",
        # the main tables' NoStruct matches the supplement's row without hard negatives
        main_negatives="mean",
    )
)
for _name, _summary, _fields in (
    ("dc", "DC: dense correspondence (mean of the best match of every sentence and image)", ("negatives",)),
    ("tk", "TK: top-k best matches of sentences and images", ("k", "negatives")),
    (
        "ap",
        "AP: assignment problem (best k-edge matching), Hessel et al. 2019's main model",
        ("k", "negatives"),
    ),
):  # the run label names the fields it reads: dc-hard, ap-full-hard
    register_objective(
        ObjectiveSpec(
            name=_name,
            summary=_summary,
            similarity=_name,
            loss=_hessel(_name),
            table_name=_name.upper(),
            label=lambda cfg, name=_name, fields=_fields: "-".join(
                [name, *(str(getattr(cfg, f)) for f in fields)]
            ),
            fields=_fields,
        )
    )
register_objective(
    ObjectiveSpec(
        name="li2021",
        summary="Li et al. 2021: cross (TK, k = min) + intra-document (I) + dropout sub-document (D)",
        similarity="tk",
        loss=_li2021_loss,
        label=lambda cfg: f"li2021-{cfg.objectives}-{cfg.backbone}",
        fields=("negatives", "objectives", "sub_fraction"),
        parts=li2021_parts,
        check=_li2021_check,
        describe=lambda cfg: f"li2021 {cfg.objectives} backbone={cfg.backbone} negatives={cfg.negatives}",
    )
)


# ------------------------------------------------------------------------------ gru


def _gru_config(cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
    from training.link.image_side import image_side
    from training.model import ModelConfig

    side = image_side(cfg, train_paths)
    return ModelConfig(
        vocab_size=vocab_size,
        word_dim=word_dim,
        image_dim=manifest.feature_extractor.dim,
        d_multi=cfg.d_multi,
        image_dropout=side.dropout,
        text_pooling=cfg.text_pooling,
        image_centring=side.centring,
        image_mean_weight=side.mean_weight,
        image_centre=cfg.image_centre,
    ).to_dict()


def _gru_build(model_cfg: dict, embeddings=None, feature_stats=None):
    from training.model import ModelConfig, MulLink

    return MulLink(ModelConfig(**model_cfg), embeddings, feature_stats)


# ------------------------------------------------------------------------------ bag


def _bag_config(cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
    """The simplest model (issue #44): MulLink with the mean word embedding + one linear layer for
    text and one linear projection of the standardised feature for images; no GRU, no centring, no
    dropout, whatever --text-pooling, --image-centring and --image-dropout say."""
    from training.model import ModelConfig

    return ModelConfig(
        vocab_size=vocab_size,
        word_dim=word_dim,
        image_dim=manifest.feature_extractor.dim,
        d_multi=cfg.d_multi,
        image_dropout=0.0,
        backbone="bag",
        text_pooling="bag",
        image_centring="none",
    ).to_dict()


# ---------------------------------------------------------------------- transformer


def _transformer_config(
    cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]
) -> dict:
    from schemas.errors import MmlinksError
    from training.link.transformer import TransformerConfig
    from training.regions import region_dim

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
    from training.link.transformer import TransformerConfig, TransformerLink

    return TransformerLink(TransformerConfig(**model_cfg), embeddings, feature_stats)


def _transformer_check(cfg: TrainConfig) -> list[str]:
    return [] if cfg.d_multi % cfg.transformer_heads == 0 else ["d_multi (divisible by transformer_heads)"]


register_backbone(
    BackboneSpec(
        name="gru",
        summary="Hessel et al. 2019: GRU sentence encoder, linear image projection (MulLink)",
        model_config=_gru_config,
        build=_gru_build,
        choose=lazy("training.link.image_side", "choose"),
    )
)
register_backbone(
    BackboneSpec(
        name="bag",
        summary="the simplest model: mean word embedding + linear (text), linear projection (image)",
        model_config=_bag_config,
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
