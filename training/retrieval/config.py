"""The coherence-retrieval family's training options (Alikhani et al.; --objective
cmca|cmcm|cmcm-c), joined into ``TrainConfig`` (``training.families.FIELDS``). The shared space
and ranking pools are the core's: the news family reads them too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from schemas.config_fields import option

RETRIEVAL = "coherence retrieval (Alikhani et al.; --objective cmca|cmcm|cmcm-c)"
# The text poolings of the coherence backbone (training/retrieval/model.py reads them from here:
# building the CLI parser must not import torch)
POOLINGS = ("attention", "mean", "last", "bag")


@dataclass
class RetrievalFields:
    """The options of the retrieval objectives and their ``coherence`` backbone."""

    # the fields a resumed run must share with its checkpoint (``training.config.MODEL_FIELDS``)
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = (
        "relation",
        "retrieval_pooling",
        "cam_hidden",
        "image_layers",
        "retrieval_margin",
    )

    relation: str = option(
        "",
        help="cmcm-c: the one relation its Coherence Aware Module predicts (a name of the dataset's "
        "relation vocabulary, e.g. Action)",
        group=RETRIEVAL,
    )
    hard_negative_warmup: int = option(
        1,
        help="retrieval: first epochs with the hinge averaged over every in-batch negative before the "
        "hardest one (from random weights the hardest-negative loss collapses)",
        at_least=0,
        group=RETRIEVAL,
    )
    lambda_cls: float = option(
        0.1,
        help="weight of the coherence loss (paper: 0.1)",
        at_least=0,
        group=RETRIEVAL,
    )
    retrieval_pooling: str = option(
        "attention",
        help="text pooling of the retrieval backbone: word attention (paper), mean / last (NoAttn), or "
        "bag: the mean of the word embeddings, no LSTM (the simplest model, a floor to compare with)",
        choices=POOLINGS,
        group=RETRIEVAL,
    )
    cam_hidden: int = option(
        256,
        help="cmcm / cmcm-c: width of a ReLU hidden layer in the Coherence Aware Module (0 = one linear "
        "layer on concat(text, image), the paper's; a hidden layer can model the agreement of the two "
        "sides, which a linear layer, a sum of one term per side, cannot: on stopped embeddings, "
        "relation mAP 0.85 with 256 units, 0.58 with none, issue #45)",
        at_least=0,
        group=RETRIEVAL,
    )
    image_layers: int = option(
        0,
        help="retrieval: ReLU hidden layers (width --d-shared) of the image encoder before its projection "
        "into the shared space (0 = one linear bottleneck, the paper's)",
        check=lambda v: 0 <= v <= 4,
        rule="0 to 4",
        group=RETRIEVAL,
    )
    retrieval_margin: float = option(
        0.5,
        help="retrieval: the triplet hinge's margin (paper: 0.3; 0.5 ranks by what a caption names "
        "more often: on the graded corpus the small digit matched in the top 5 0.62 vs 0.57 of the "
        "time, MedR 9.0 vs 10.1 over 4 seeds, issue #45)",
        check=lambda v: v > 0,
        rule="> 0",
        group=RETRIEVAL,
    )
    cam_gradient: str = option(
        "stopped",
        help="cmcm / cmcm-c: stopped = the coherence loss trains only the Coherence Aware Module, on the "
        "retrieval embeddings with their gradient stopped, so the relation loss cannot pull the "
        "encoders away from retrieval (issue #45: test MedR 11 vs 19 shared, CMCA 10); shared = it "
        "trains the text and image encoders too (the paper's)",
        choices=("shared", "stopped"),
        group=RETRIEVAL,
    )
    query_bank: int = option(
        2000,
        help="retrieval: training captions the model keeps to rank an image for a text by its cosine minus "
        "its soft-maximum cosine to those captions (querybank normalisation: images near every caption "
        "stop crowding the top ranks; graded corpus MedR 8.1 -> 7.0 over 4 seeds, issue #45); 0 = the "
        "plain cosine (the paper's)",
        at_least=0,
        group=RETRIEVAL,
    )
    query_bank_temperature: float = option(
        0.1,
        help="retrieval: temperature of the query bank's soft maximum (small: the nearest captions "
        "decide; large: all of them, a mean)",
        check=lambda v: v > 0,
        rule="> 0",
        group=RETRIEVAL,
    )
    refine_lambda: float = option(
        0.12,
        help="selective refinement: lambda of the confidence exp(lambda |p - 0.5|) "
        "(paper: 0.13 CITE++, 0.12 Clue)",
        at_least=0,
        group=RETRIEVAL,
    )
    refine_threshold: float = option(
        0.1,
        help="selective refinement: queries whose top-2 similarity gap is below this are refined "
        "(paper: 0.1)",
        at_least=0,
        group=RETRIEVAL,
    )
