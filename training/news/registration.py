"""The news family's registrations: the ``news`` objective and backbone (Liu et al.), added to
the core's registries (``training.families``), and the family's hooks (``training.family_hooks``):
its staged recipe (the run plan) and its backbone's run warnings (a news run otherwise ends as a
retrieval run: its family is "retrieval"). Its "news-archive" packaging and the promotion gate's
metrics of its served models are ``models/``'s (``models.experiment``, ``models.registry``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from training.backbone import BackboneSpec, only_its_objectives, register_backbone
from training.family_hooks import register_run_plan
from training.objectives.registry import ObjectiveSpec, lazy, register_objective, unused_loss

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig


def _news_label(cfg: TrainConfig) -> str:
    """e.g. news-headline+lead+body+caption-attention-drop0.3-vse, news-caption-vse"""
    sources = cfg.news_sources.replace(",", "+").replace(" ", "")
    fusion = f"-{cfg.fusion}" if "+" in sources else ""
    from training.news.config import drop_rate

    rate = drop_rate(cfg)
    drop = f"-drop{rate:g}" if rate else ""
    recipe = {"one-for-all": "-ofa", "all-for-one": "-afo"}.get(cfg.multilingual, "")
    if cfg.init_from and "=" in cfg.init_from:
        recipe += "-dc"
    encoder = "" if cfg.news_encoder == "attention" else f"-{cfg.news_encoder}"
    return f"news-{sources}{fusion}{drop}-{cfg.news_loss}{encoder}{recipe}"


def _news_check(cfg: TrainConfig) -> list[str]:
    from schemas.news import parse_sources

    try:
        sources = parse_sources(cfg.news_sources)
    except ValueError as exc:
        return [f"news_sources ({exc})"]
    from training.news.config import drop_rate
    from training.news.recipes import check

    bad = (
        ["random_drop (a single-source model has nothing to drop)"]
        if len(sources) == 1 and drop_rate(cfg)
        else []
    )
    return bad + check(cfg)


register_objective(
    ObjectiveSpec(
        name="news",
        summary="news image selection (Liu et al.): headline/lead/body/caption encoders (self-attention + "
        "point-wise CNN + max pool), fused; VSE, VSE++ or HAL; random_drop",
        similarity="dc",  # a sample is one text x one image: every similarity is the cosine
        loss=unused_loss,  # model_loss replaces it
        label=_news_label,
        fields=(
            "news_sources",
            "fusion",
            "random_drop",
            "news_loss",
            "news_encoder",
            "subword_buckets",
            "subword_pooling",
            "news_max_tokens",
            "news_heads",
            "d_shared",
            "multilingual",
            "init_from",
            "fuser_warmup_epochs",
            "news_recipe",
        ),
        parts=lambda cfg: ("ret",),
        check=_news_check,
        describe=lambda cfg: (
            f"{_news_label(cfg)} d_shared={cfg.d_shared} subword_buckets={cfg.subword_buckets}"
        ),
        family="retrieval",
        backbone="news",
        model_loss=lazy("training.news.objective", "model_loss"),
        val_metrics=lazy("training.news.objective", "val_metrics"),
        columns=("metadata",),
        link_metrics=False,
        packaging="news-archive",
        check_data=lazy("schemas.news", "check_news_dataset"),
    )
)


# ------------------------------------------------------------------------------ news


register_backbone(
    BackboneSpec(
        name="news",
        summary="Liu et al.: per-source self-attention + point-wise CNN + max-pool text encoders, a fuser, "
        "a linear image projection; the backbone of --objective news",
        model_config=lazy("training.news.objective", "model_config"),
        build=lazy("training.news.objective", "build"),
        check=only_its_objectives("news"),
        evaluation="news",
        run_warnings=lazy("training.news.experiment", "cut_warnings"),
    )
)


# ------------------------------------------------------------------------ the run's plan


register_run_plan("news", lazy("training.news.staged", "run_staged"))
