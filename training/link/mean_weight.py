"""The GRU backbone's ``--image-mean-weight`` resolved: the weight of the document-mean part of a
``balanced`` image feature, measured from the training split when it is -1 (auto).

Its own module because it reads shards (the registration module stays free of data reading)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig

# --image-mean-weight -1 (auto): the document-mean part at 1 when the training split's image
# ratio is at least AUTO_RATIO (its documents' images share a strong look), else 0.5. Measured
# (docs/benchmarks.md, issue #33): at ratio 12.5 two corpora link only at 1 (test AUC 90 / 97.6
# against 62 / 77 at 0.5); at ratios 0.24-2.8 and on the demo 0.5 is 0.5-1.7 AUC better.
AUTO_RATIO = 5.0
AUTO_WEIGHTS = (0.5, 1.0)  # below AUTO_RATIO, at or above it
AUTO_SAMPLE = 5000  # training documents read to measure the ratio


def image_mean_weight(cfg: TrainConfig, train_paths: list[str]) -> float:
    """``cfg.image_mean_weight``, or when it is -1 (auto) the weight the training split's
    image ratio (``pipelines.confounds.image_ratio``) calls for."""
    if cfg.image_mean_weight >= 0:
        return cfg.image_mean_weight
    if cfg.image_centring != "balanced":  # the weight is unused; keep the saved config readable
        return AUTO_WEIGHTS[0]
    from pipelines.confounds import image_ratio
    from schemas.shards import read_documents

    docs = []
    for path in train_paths:
        docs.extend(read_documents([path]))
        if len(docs) >= AUTO_SAMPLE:
            break
    feats = [[im.features for im in d.images if im.features is not None] for d in docs[:AUTO_SAMPLE]]
    ratio, _ = image_ratio([f for f in feats if f])
    return AUTO_WEIGHTS[ratio is not None and ratio >= AUTO_RATIO]
