"""The link family's training options: Hessel et al. 2019's and Li et al. 2021's objectives, the
GRU and Transformer backbones, and the pretrained towers.

A dataclass of ``option`` fields that ``training.config.TrainConfig`` takes in as a base
(``training.families.FIELDS`` names it), so users and the CLI still see one config while each
option is declared with the family that reads it. No torch: the CLI imports it for its flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from schemas.config_fields import option
from training.link.li2021_parts import LI2021_PARTS
from training.text_pooling import TEXT_POOLING

LINK = "document linking (Hessel et al. 2019, Li et al. 2021; --objective nostruct|dc|tk|ap|li2021)"
PRETRAINED = "document linking: pretrained towers (--backbone minilm|clip, issue #20)"


def li2021_part_choices() -> tuple[str, ...]:
    """C alone or with any of the other Li 2021 parts, in their order: C, C+I, C+D, C+I+D."""
    from itertools import combinations

    rest = LI2021_PARTS[1:]
    return tuple("+".join(("C", *c)) for r in range(len(rest) + 1) for c in combinations(rest, r))


@dataclass
class LinkFields:
    """The options of the link objectives and backbones (``--help``: two groups)."""

    # the fields a resumed run must share with its checkpoint (``training.config.MODEL_FIELDS``)
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = (
        "k",
        "negatives",
        "objectives",
        "d_multi",
        "text_pooling",
        "image_centring",
        "image_mean_weight",
        "image_centre",
        "transformer_layers",
        "transformer_heads",
        "tower_tuning",
        "unfreeze_blocks",
        "clip_model",
    )

    k: str = option("full", help="k for TK/AP", choices=("full", "half"), group=LINK)
    negatives: str = option(
        "hard", help="pool in-batch negatives by max (hard) or mean", choices=("hard", "mean"), group=LINK
    )
    negatives_warmup: int = option(
        3,
        help="link objectives: first epochs with the hinge averaged over every in-batch negative "
        "(mean) before --negatives; the hardest negative of a batch is mostly the document whose "
        "images look most alike, so from random weights it teaches the look, not the content",
        at_least=0,
        group=LINK,
    )
    objectives: str = option(
        "C",
        help="li2021 terms: C cross-document, I intra-document NegTK, D dropout sub-document",
        choices=lambda: li2021_part_choices(),
        group=LINK,
    )
    sub_fraction: float = option(
        0.8,
        help="li2021 D: share of sentences and images kept in a sub-document (paper: 0.6 DII/SIS)",
        check=lambda v: 0 < v <= 1,
        rule="in (0, 1]",
        group=LINK,
    )
    d_multi: int = option(
        1024,
        help="joint space width = GRU units (paper: 1024)",
        at_least=1,
        group=LINK,
    )
    text_pooling: str = option(
        "max",
        help="how a sentence becomes one vector (gru backbone): last = the GRU's final state (paper), "
        "mean / max over its states, bigru = bidirectional, bag = mean word embedding + linear",
        choices=lambda: tuple(TEXT_POOLING),
        group=LINK,
    )
    image_centring: str = option(
        "auto",
        help="what the image encoder reads (gru backbone): none = each image's feature alone (paper); "
        "balanced = its within-document part (the image minus its document's look, the median image: "
        "--image-centre) plus that look, each standardised over the training split, the look weighted "
        "by --image-mean-weight, so a look all of a document's images share (a room, a light, a camera) "
        "cannot drown what tells them apart; doc = the within-document part alone; doc+raw = it and "
        "the raw feature, concatenated (separate weights: unstable, docs/training.md); auto = measured on "
        "the corpus: none, balanced and balanced with dropout 0.4 (gru) and the bag backbone are each "
        "trained briefly, and the one whose validation scores hold the most within-document link "
        "structure is trained (no labels read; issue #60: a threshold rule on the image ratio lost 6-12 "
        "AUC to the bag on 2-3 images per document and on topics with several looks)",
        choices=("auto", "none", "doc", "doc+raw", "balanced"),
        group=LINK,
    )
    image_mean_weight: float = option(
        -1.0,
        help="--image-centring balanced: weight of the document-mean part beside the within-document "
        "part (0 = doc); -1 = auto: 1 with --image-centring auto's balanced candidates; with balanced "
        "given by hand, 1 when the training split's image ratio (data inspect --confounds) is >= 5, else "
        "0.5 (a 600-document ratio-12.5 corpus stayed at chance at 0.5 and linked at 1; unconfounded "
        "corpora and the demo link best at 0.5: docs/benchmarks.md)",
        check=lambda v: v >= 0 or v == -1,
        rule=">= 0, or -1 (auto)",
        group=LINK,
    )
    image_centre: str = option(
        "median",
        help="--image-centring balanced, doc or doc+raw: what a document's shared look is taken to be: "
        "median = the per-channel median of its images, which one odd image (a close-up among room "
        "shots) does not move; mean = their mean (issue #33's; models saved before the median keep "
        "it). The median lifted balanced 1.2-2.3 AUC on corpora the mean lost to the bag: "
        "docs/benchmarks-linking.md",
        choices=("median", "mean"),
        group=LINK,
    )
    transformer_layers: int = option(3, help="transformer layers", at_least=1, group=LINK)
    transformer_heads: int = option(8, help="attention heads", at_least=1, group=LINK)
    tower_tuning: str = option(
        "heads",
        help="pretrained towers (minilm, clip): frozen = the encoder as is, only the image side learns "
        "its space; heads = frozen encoder + trained text and image heads; last-blocks = heads + the "
        "encoder's last --unfreeze-blocks blocks at lr x --encoder-lr-scale",
        choices=("frozen", "heads", "last-blocks"),
        group=PRETRAINED,
    )
    unfreeze_blocks: int = option(
        2,
        help="last-blocks: how many of the encoder's last transformer blocks train",
        at_least=1,
        group=PRETRAINED,
    )
    encoder_lr_scale: float = option(
        0.1,
        help="last-blocks: the unfrozen blocks' learning rate as a fraction of --lr",
        check=lambda v: 0 < v <= 1,
        rule="in (0, 1]",
        group=PRETRAINED,
    )
    clip_model: str = option(
        "ViT-B-32",
        help="--backbone clip: the open_clip architecture of the weights (ViT-B-32-quickgelu for "
        "OpenAI's release file) or an open_clip JSON config file",
        group=PRETRAINED,
    )
    clip_weights: str = option(
        "",
        help="--backbone clip: the CLIP weight file the dataset's clip-vit-b32 features were built "
        "with (default: $MMLINKS_WEIGHTS_DIR/clip-vit-b32.pt or the torch cache; nothing is downloaded)",
        group=PRETRAINED,
    )
