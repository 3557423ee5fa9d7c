"""How strongly a dataset's documents are confounded: what every image, or every sentence, of one
document shares (issue #33; the figures and their meaning: docs/training.md).

Why: when a document's images share a look or its sentences share topic words, documents are
told apart without learning the links, and a model stays near chance inside them. Content
tokens are those in at most ``CONTENT_MAX_DF`` of the documents, so no stop-word list is needed.
Shards only: no labels, no model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from schemas.text import tokenize

# A token in more than this share of a split's documents is not "content" (corpus-wide words).
CONTENT_MAX_DF = 0.25
# Above these, `mmlinks train` and the training report call the split strongly confounded.
STRONG_IMAGE_RATIO = 3.0
STRONG_TEXT_SHARE = 0.2
# The residual image ratio (issue #44): the ratio once the r principal directions of the document
# means are dropped, r = residual_directions(...): up to RESIDUAL_DIRECTIONS, at most a quarter of
# the feature width and of the documents (n means span n - 1 directions; dropping most of them
# would drop any look), none below RESIDUAL_MIN_DIRECTIONS; over a split's first RESIDUAL_SAMPLE
# documents (one SVD of their means; `mmlinks train --image-centring auto` reads the same sample).
RESIDUAL_DIRECTIONS = 48
RESIDUAL_MIN_DIRECTIONS = 16
RESIDUAL_SAMPLE = 5000


@dataclass(frozen=True)
class SplitConfounds:
    """The confound figures of one split (None where no document qualifies)."""

    documents: int
    image_ratio: float | None  # between / within-document variance of the image features
    image_documents: int  # documents with >= 2 images (those the ratio averages over)
    text_share: float | None  # share of content tokens that occur in most of their doc's sentences
    text_documents: int  # documents with >= 2 sentences
    # the image ratio once the look's main directions are dropped: near the unconfounded ~0.2-0.5
    # when a few topics share the look (one linear map drops it), high when each document has
    # its own (None: too narrow features or too few documents for RESIDUAL_MIN_DIRECTIONS, or no ratio)
    image_residual: float | None = None
    # issue #60: the ratio with each document mean's share of its own images' spread taken out
    # (a mean of n images carries 1/n of their within-document variance: the plain ratio of one look
    # reads 3.9 at 4-7 images and 7.1 at 2), so corpora of few and of many images per document compare
    image_ratio_corrected: float | None = None
    # issue #60: mean cosine of two images of one document minus that of two of different documents
    # (standardised features): sees a look of any form (a gain per channel, one of a topic's several
    # looks per image, a look on some images only) where the variance ratio may stay near 1
    image_similarity_gap: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def strong(self) -> bool:
        return (self.image_ratio or 0.0) >= STRONG_IMAGE_RATIO or (
            self.text_share or 0.0
        ) >= STRONG_TEXT_SHARE


def image_ratio(docs_features: Sequence[np.ndarray], drop_directions: int = 0) -> tuple[float | None, int]:
    """(ratio, documents it averages over) for per-document feature matrices ``[n_i, dim]``.

    Standardised over every image given (documents with one image count in the standardisation,
    not in the ratio); a dimension with zero spread is left out. ``drop_directions`` r > 0: the
    ratio left once the r principal directions of the document means are projected out of every
    vector (the *residual* ratio, issue #44): a look shared by a few topics lies in a few such
    directions, which one linear map can drop, so its residual falls to an unconfounded corpus's;
    a look per document, or per one of hundreds of topics, spreads over many and stays."""
    mats = [np.asarray(m, dtype=np.float64) for m in docs_features if len(m)]
    if not mats:
        return None, 0
    allx = np.concatenate(mats)
    mean, std = allx.mean(0), allx.std(0)
    keep = std > 1e-12
    if not keep.any():
        return None, 0
    multi = [m for m in mats if len(m) >= 2]
    basis = None  # [r, dim]: one document at a time, so no second copy of the features is held
    if multi and drop_directions > 0:
        centres = np.stack([((m[:, keep] - mean[keep]) / std[keep]).mean(0) for m in multi])
        basis = np.linalg.svd(centres, full_matrices=False)[2][:drop_directions]
    between, within = [], []
    for m in multi:
        z = (m[:, keep] - mean[keep]) / std[keep]
        if basis is not None:
            z = z - (z @ basis.T) @ basis
        centre = z.mean(0)
        between.append(float((centre**2).sum()))
        within.append(float(((z - centre) ** 2).sum(1).mean()))
    if not between or sum(within) <= 0:
        return None, len(between)
    return float(np.mean(between) / np.mean(within)), len(between)


def corrected_image_ratio(docs_features: Sequence[np.ndarray]) -> float | None:
    """The image ratio with the sampling spread of each document mean removed: per document of n
    images, within = the unbiased within-document variance (sum of squares / (n - 1)) and between
    = |mean|^2 - within / n (a mean of n draws spreads by within / n around the look), both on
    standardised features; ratio = mean(between) / mean(within). The same look reads the same
    at 2 images per document as at 15 (the plain ratio grows as n falls)."""
    mats = [np.asarray(m, dtype=np.float64) for m in docs_features if len(m)]
    if not mats:
        return None
    allx = np.concatenate(mats)
    mean, std = allx.mean(0), allx.std(0)
    keep = std > 1e-12
    between, within = [], []
    for m in mats:
        if len(m) < 2:
            continue
        z = (m[:, keep] - mean[keep]) / std[keep]
        centre = z.mean(0)
        w = float(((z - centre) ** 2).sum() / (len(z) - 1))
        between.append(float((centre**2).sum()) - w / len(z))
        within.append(w)
    if not within or sum(within) <= 0:
        return None
    return float(np.mean(between) / np.mean(within))


def similarity_gap(docs_features: Sequence[np.ndarray], pairs: int = 20_000, seed: int = 0) -> float | None:
    """Mean cosine of two images of one document minus that of two images of different documents,
    on features standardised over the split (``pairs`` random pairs of each kind); None without
    two documents of >= 2 images. Near 0 for unrelated photos, up to 1 when a look dominates."""
    mats = [np.asarray(m, dtype=np.float64) for m in docs_features if len(m)]
    multi = [i for i, m in enumerate(mats) if len(m) >= 2]
    if len(multi) < 2:
        return None
    allx = np.concatenate(mats)
    mean, std = allx.mean(0), allx.std(0)
    keep = std > 1e-12
    unit = []
    for m in mats:
        z = (m[:, keep] - mean[keep]) / std[keep]
        unit.append(z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12))
    # one array of every image and each document's row offset: the pairs are drawn at once, not in
    # a Python loop (training logs these figures on every run)
    allu = np.concatenate(unit)
    starts = np.cumsum([0] + [len(u) for u in unit])[:-1]
    sizes = np.array([len(u) for u in unit])
    multi_a = np.array(multi)
    rng = np.random.default_rng(seed)
    d = multi_a[rng.integers(len(multi_a), size=pairs)]
    a = rng.integers(sizes[d])
    b = (a + 1 + rng.integers(sizes[d] - 1)) % sizes[d]  # another image of the same document
    same = np.einsum("ij,ij->i", allu[starts[d] + a], allu[starts[d] + b])
    i, j = multi_a[rng.integers(len(multi_a), size=pairs)], multi_a[rng.integers(len(multi_a), size=pairs)]
    ok = i != j
    i, j = i[ok], j[ok]
    other = np.einsum(
        "ij,ij->i", allu[starts[i] + rng.integers(sizes[i])], allu[starts[j] + rng.integers(sizes[j])]
    )
    return float(np.mean(same) - np.mean(other))


def residual_directions(dim: int, documents: int) -> int:
    """How many principal directions of the document means the residual ratio drops for
    ``documents`` multi-image documents of ``dim``-wide features (0: too few for a residual)."""
    r = min(RESIDUAL_DIRECTIONS, dim // 4, (documents - 1) // 4)
    return r if r >= RESIDUAL_MIN_DIRECTIONS else 0


def residual_ratio(docs_features: Sequence[np.ndarray]) -> float | None:
    """The image ratio once ``residual_directions`` principal directions of the document means
    are dropped (None where that is 0). Measured (docs/benchmarks-linking.md, issue #44; 256-d, 1,500
    documents) as a share of the ratio, dropping 16 / 32 / 48 directions: 40 topics' looks 0.46 /
    0.12 / 0.02, 10 topics' 0.02 throughout, 200 topics' 0.81 / 0.66 / 0.53, a look per document
    0.96 / 0.93 / 0.89, #33's looks cut from a few photos (1280-d, 400 documents) 0.50 / 0.37 /
    0.30: only 48 directions tell 40 topics' looks from #33's."""
    mats = [m for m in docs_features if len(m)]
    multi = sum(1 for m in mats if len(m) >= 2)
    r = residual_directions(len(mats[0][0]) if mats else 0, multi)
    return image_ratio(mats, drop_directions=r)[0] if r else None


def text_share(
    docs_sentences: Sequence[Sequence[str]], max_df: float = CONTENT_MAX_DF
) -> tuple[float | None, int]:
    """(share, documents it averages over): content-token occurrences whose token is in more
    than half of the document's sentences, over all content-token occurrences, per document,
    then averaged over documents with >= 2 sentences and any content token."""
    tokenised = [
        [set(t for t in tokenize(s) if any(c.isalnum() for c in t)) for s in sents]
        for sents in docs_sentences
    ]
    df: Counter[str] = Counter()
    for sents in tokenised:
        df.update(set().union(*sents) if sents else set())
    limit = max_df * max(1, len(tokenised))
    shares = []
    for sents in tokenised:
        if len(sents) < 2:
            continue
        in_sentences: Counter[str] = Counter()
        for toks in sents:
            in_sentences.update(t for t in toks if df[t] <= limit)
        total = sum(in_sentences.values())
        if not total:
            continue
        shared = sum(n for n in in_sentences.values() if n > len(sents) / 2)
        shares.append(shared / total)
    return (float(np.mean(shares)) if shares else None), len(shares)


def split_confounds(documents: Iterable) -> SplitConfounds:
    """The figures of one split's ``schemas.document.Document`` objects."""
    feats, sents, n = [], [], 0
    for doc in documents:
        n += 1
        vecs = [im.features for im in doc.images if im.features is not None]
        feats.append(np.asarray(vecs, dtype=np.float32) if vecs else np.zeros((0, 0), np.float32))
        sents.append(doc.sentences)
    feats = [f for f in feats if f.size]
    ratio, n_img = image_ratio(feats)
    residual = None
    if ratio is not None:
        residual = residual_ratio(feats[:RESIDUAL_SAMPLE])
    share, n_txt = text_share(sents)
    return SplitConfounds(
        n, ratio, n_img, share, n_txt, residual, corrected_image_ratio(feats), similarity_gap(feats)
    )


def dataset_confounds(
    directory: str | Path, splits: Sequence[str] | None = None, max_documents: int | None = None
) -> dict[str, SplitConfounds]:
    """``{split: SplitConfounds}`` of a built dataset (every split in its manifest by default);
    ``max_documents``: only each split's first documents, shard by shard (training measures
    its split this way, so a large corpus costs a bounded read)."""
    from schemas.manifest import Manifest

    manifest = Manifest.read(directory)
    names = list(splits) if splits else list(manifest.counts.get("splits", {}))
    root = Path(directory)
    return {split: shards_confounds(manifest.shard_paths(root, split), max_documents) for split in names}


def shards_confounds(paths: Sequence, max_documents: int | None = None) -> SplitConfounds:
    """The figures of one split's shards (``paths``), read shard by shard; ``max_documents``:
    only its first documents."""
    from schemas.shards import read_documents

    docs: list = []
    for path in paths:
        docs.extend(read_documents([path]))
        if max_documents is not None and len(docs) >= max_documents:
            docs = docs[:max_documents]
            break
    return split_confounds(docs)
