"""The GRU backbone's image side resolved from the training split (issue #33, issue #44):
``--image-centring auto`` and ``--image-mean-weight -1`` (auto) read the training split's image
ratio (``pipelines.confounds.image_ratio``: how much of an image's feature its document shares).

Below AUTO_RATIO the images are read as they are (``none``); at or above it, ``balanced``
centring with the document-mean part at weight 1. Measured (docs/benchmarks.md): at ratio 12.5
two #33 corpora link only with balanced centring at weight 1 (test AUC 90 / 97.6 against 62 / 77
at 0.5); on issue #44's family, balanced centring cost 1.0-1.2 AUC at ratios 0.2-3 against
``none`` (98.6 vs 99.7 at ratio 2.7, 10 topics), while at ratios >= 20 ``none`` fell to 53 (200
topics, clipped) and 72 (per-document looks) where balanced reached 98.

Its own module because it reads shards (the registration module stays free of data reading)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig

AUTO_RATIO = 5.0
AUTO_WEIGHTS = (0.5, 1.0)  # --image-mean-weight auto below AUTO_RATIO, at or above it
AUTO_SAMPLE = 5000  # training documents read to measure the ratio


def training_image_ratio(train_paths: list[str]) -> float | None:
    """The image ratio of the first AUTO_SAMPLE training documents (None: too few images)."""
    from pipelines.confounds import image_ratio
    from schemas.shards import read_documents

    docs = []
    for path in train_paths:
        docs.extend(read_documents([path]))
        if len(docs) >= AUTO_SAMPLE:
            break
    feats = [[im.features for im in d.images if im.features is not None] for d in docs[:AUTO_SAMPLE]]
    ratio, _ = image_ratio([f for f in feats if f])
    return ratio


def image_side(cfg: TrainConfig, train_paths: list[str]) -> tuple[str, float]:
    """(``image_centring``, ``image_mean_weight``) with ``auto`` / -1 resolved from the training
    split; the ratio is read only when one of them is auto. A weight that is unused (centring
    other than balanced) is 0.5, the old default, so the saved config stays readable."""
    centring, weight = cfg.image_centring, cfg.image_mean_weight
    strong = None
    if centring == "auto" or (centring == "balanced" and weight < 0):
        ratio = training_image_ratio(train_paths)
        strong = ratio is not None and ratio >= AUTO_RATIO
    if centring == "auto":
        centring = "balanced" if strong else "none"
    if centring != "balanced":
        return centring, AUTO_WEIGHTS[0] if weight < 0 else weight
    return centring, weight if weight >= 0 else AUTO_WEIGHTS[bool(strong)]
