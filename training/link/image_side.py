"""The GRU backbone's image side resolved from the training split (issue #33, issue #44):
``--image-centring auto``, ``--image-mean-weight -1`` and ``--image-dropout -1`` (auto) read the
training split's image ratio (``pipelines.confounds.image_ratio``: how much of an image's feature
its document shares) and, when it is strong, its *residual* ratio (the same once up to 48
principal directions of the document means are dropped: ``pipelines.confounds.residual_ratio``).

- ratio below AUTO_RATIO: the images as they are (``none``), dropout 0.4.
- ratio at or above it, residual below LINEAR_RESIDUAL (a look shared by a few dozen topics at
  most: it lies in a few directions that one linear map drops): the bag baseline's image side,
  ``none`` with no dropout.
- otherwise (a look per document, or per one of many topics): ``balanced`` centring with the
  document-mean part at weight 1, dropout 0.4.

Measured (docs/benchmarks-linking.md): at ratio 12.5 two #33
corpora link only with balanced centring at weight 1 (test AUC 90 / 97.6 against 62 / 77 at 0.5);
on issue #44's family balanced cost ~1 AUC at ratios 0.2-3 against ``none``; at ratios >= 20
``none`` fell to 53 (200 topics, clipped) and 72 (per-document looks) where balanced reached 98;
with 10 topics at ratio 8-16 (residual 0.2) balanced stayed at 98.4-98.5 and ``none`` with dropout
0.4 fell to 95.7 where ``none`` without dropout reached the bag's 99.3-99.7 (dropout on a feature
that is mostly look is mostly noise); with 40 topics at ratio 10-20 (residual 0.2 at 48
directions; 4.6-9 at 16) ``none`` without dropout reached 99.0-99.5 where balanced stayed at
98.4-98.5 (bag 98.5-99.2).

Its own module because it reads shards (the registration module stays free of data reading)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipelines.confounds import RESIDUAL_SAMPLE

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig

AUTO_RATIO = 5.0
AUTO_WEIGHTS = (0.5, 1.0)  # --image-mean-weight auto below AUTO_RATIO, at or above it
AUTO_SAMPLE = RESIDUAL_SAMPLE  # training documents read to measure the ratio
LINEAR_RESIDUAL = 1.0  # residual below it: the look lies in those directions (10-40 topics: 0.2)
AUTO_DROPOUT = 0.4  # --image-dropout auto, except on the bag's image side (0)


@dataclass(frozen=True)
class ImageSide:
    """What the GRU backbone's image encoder reads: ``ModelConfig``'s three image fields."""

    centring: str
    mean_weight: float
    dropout: float


def training_image_ratios(train_paths: list[str]) -> tuple[float | None, float | None]:
    """(ratio, residual ratio) of the first AUTO_SAMPLE training documents (None: too few
    images; the residual is None below AUTO_RATIO and where ``residual_directions`` is 0)."""
    from pipelines.confounds import image_ratio, residual_ratio
    from schemas.shards import read_documents

    docs = []
    for path in train_paths:
        docs.extend(read_documents([path]))
        if len(docs) >= AUTO_SAMPLE:
            break
    feats = [[im.features for im in d.images if im.features is not None] for d in docs[:AUTO_SAMPLE]]
    feats = [f for f in feats if f]
    ratio, _ = image_ratio(feats)
    if ratio is None or ratio < AUTO_RATIO:
        return ratio, None  # the residual decides only between strong looks
    return ratio, residual_ratio(feats)


def image_side(cfg: TrainConfig, train_paths: list[str]) -> ImageSide:
    """``cfg``'s image side with ``auto`` / -1 resolved from the training split; the split is read
    only when something is auto. A weight that is unused (centring other than balanced) is 0.5,
    the old default, so the saved config stays readable."""
    centring, weight, dropout = cfg.image_centring, cfg.image_mean_weight, cfg.image_dropout
    strong = linear = False
    if centring == "auto" or (centring == "balanced" and weight < 0):
        ratio, residual = training_image_ratios(train_paths)
        strong = ratio is not None and ratio >= AUTO_RATIO
        linear = strong and residual is not None and residual < LINEAR_RESIDUAL
    if centring == "auto":
        centring = "none" if linear or not strong else "balanced"
    if dropout < 0:
        dropout = 0.0 if linear and cfg.image_centring == "auto" else AUTO_DROPOUT
    if centring != "balanced":
        return ImageSide(centring, AUTO_WEIGHTS[0] if weight < 0 else weight, dropout)
    return ImageSide(centring, weight if weight >= 0 else AUTO_WEIGHTS[bool(strong)], dropout)
