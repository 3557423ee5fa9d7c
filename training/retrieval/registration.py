"""The retrieval family's registrations: the CMCA, CMCM and CMCM_c objectives (Alikhani et al.)
and their ``coherence`` backbone, added to the core's registries (``training.families``), and
the family's hook (``training.family_hooks``): the end of its runs (news's too). The promotion
gate's metrics of its served models are ``models/``'s (``models.registry``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from training.backbone import BackboneSpec, only_its_objectives, register_backbone
from training.family_hooks import register_run_finish
from training.objectives.registry import (
    ObjectiveSpec,
    get_objective,
    lazy,
    register_objective,
    relation_problems,
    unused_loss,
)

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig


def _retrieval_check(cfg: TrainConfig) -> list[str]:
    return relation_problems(cfg.objective, cfg.relation)


def _retrieval_label(cfg: TrainConfig) -> str:
    # the paper's NoAttn rows, and the bag baseline by its own name
    pooling = {"attention": "", "bag": "-bag"}.get(cfg.retrieval_pooling, "-noattn")
    return f"{cfg.objective}{'-' + cfg.relation if cfg.relation else ''}{pooling}"


# (name, summary, Tables 4/5 row name, its ablation rows, has the CAM, one model per relation)
for _name, _summary, _table, _ablations, _cam, _per_relation in (
    (
        "cmca",
        "CMCA: coherence-agnostic text-to-image retrieval (Alikhani et al.): BiLSTM + attention, "
        "VSE++ triplet",
        "CMCA",
        (),
        False,
        False,
    ),
    (
        "cmcm",
        "CMCM: CMCA + the Coherence Aware Module predicting every relation of the dataset (lambda_cls)",
        "CMCM",
        ({"retrieval_pooling": "mean"},),  # CMCM-NoAttn: mean pooling instead of word attention
        True,
        False,
    ),
    (
        "cmcm-c",
        "CMCM_c: CMCA + the Coherence Aware Module predicting one relation (--relation)",
        "CMCM",
        (),
        True,
        True,
    ),
):
    register_objective(
        ObjectiveSpec(
            name=_name,
            summary=_summary,
            similarity="dc",  # a pair is a 1 x 1 document: every similarity is the cosine
            loss=unused_loss,  # model_loss replaces it
            label=_retrieval_label,
            fields=(
                "negatives",
                "hard_negative_warmup",
                "relation",
                "lambda_cls",
                "retrieval_pooling",
                "d_shared",
                "cam_hidden",
                "cam_gradient",
                "image_layers",
                "retrieval_margin",
                "query_bank",
                "query_bank_temperature",
            ),
            parts=(lambda cfg: ("ret", "cls") if get_objective(cfg.objective).cam else ("ret",)),
            check=_retrieval_check,
            describe=lambda cfg: (
                f"{_retrieval_label(cfg)} d_shared={cfg.d_shared} lambda_cls={cfg.lambda_cls}"
                + (f" cam_hidden={cfg.cam_hidden}" if cfg.cam_hidden else "")
            ),
            table_name=_table,
            ablations=_ablations,
            family="retrieval",
            backbone="coherence",
            per_relation=_per_relation,
            needs_relations=True,
            cam=_cam,
            model_loss=lazy("training.retrieval.objective", "model_loss"),
            val_metrics=lazy("training.retrieval.objective", "val_metrics"),
            columns=("metadata",),
            packaging="pairs",
        )
    )


# ------------------------------------------------------------------------ coherence


register_backbone(
    BackboneSpec(
        name="coherence",
        summary="Alikhani et al.: BiLSTM + word attention and a CNN-feature bottleneck into a 300-d space "
        "(+ the Coherence Aware Module); the backbone of --objective cmca|cmcm|cmcm-c",
        model_config=lazy("training.retrieval.objective", "model_config"),
        build=lazy("training.retrieval.objective", "build"),
        check=only_its_objectives("coherence"),
        evaluation="pairs",
    )
)


# ------------------------------------------------------------------------ the run's end


register_run_finish("retrieval", lazy("training.retrieval.experiment", "finish_run"))  # news runs too
