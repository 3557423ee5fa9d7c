"""Per-document link metrics (AUC, p@k), macro-averaged x100, as in Hessel et al. 2019.

Documents with no positive cell, or only positive cells, are skipped (AUC is undefined). Why p@k
is the expected precision over random tie orders: a fixed order would reward a constant model
whenever the first cell happens to be a link, common where the first caption is the first image's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def label_matrix(n: int, m: int, links: list[tuple[int, int]]) -> np.ndarray:
    y = np.zeros((n, m), dtype=bool)
    for s, i in links:
        y[s, i] = True
    return y


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of a 1-D array, ties sharing their average rank (``scipy.stats.rankdata``'s
    default, its oracle in the tests).

    Written here because importing ``scipy.stats`` costs about a CPU-second, paid by every
    process that imports this module (each ``mmlinks`` command and each Ray Train worker), for
    one sort.
    """
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], values.size]
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties (equals the pairwise definition).

    NaN scores (a diverged model) give NaN rather than a number that looks valid.
    """
    scores, labels = np.ravel(scores).astype(np.float64), np.ravel(labels).astype(bool)
    pos = int(labels.sum())
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        raise ValueError("AUC needs at least one positive and one negative cell")
    if np.isnan(scores).any():
        return float("nan")
    ranks = average_ranks(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def precision_at_k(scores: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Fraction of true links among the k highest cells of the flattened matrix.

    One ranking over all n*m cells; k > n*m uses every cell. Cells tied with the k-th highest
    score share the remaining places in proportion (the mean over random tie orders).
    """
    flat_s, flat_y = np.ravel(scores).astype(np.float64), np.ravel(labels).astype(bool)
    if k < 1:
        raise ValueError("k must be >= 1")
    if np.isnan(flat_s).any():
        return float("nan")
    k = min(k, flat_s.size)
    kth = np.sort(flat_s)[::-1][k - 1]
    above, tied = flat_s > kth, flat_s == kth
    n_above = int(above.sum())
    hits = flat_y[above].sum() + (k - n_above) * flat_y[tied].sum() / tied.sum()
    return float(hits / k)


@dataclass
class DocMetrics:
    doc_id: str
    auc: float
    p_at_1: float
    p_at_5: float
    n_sentences: int = 0
    n_images: int = 0
    n_links: int = 0  # positive cells


def document_metrics(
    doc_id: str, scores: np.ndarray, links: list[tuple[int, int]] | None
) -> DocMetrics | None:
    """Metrics of one document's n x m score matrix; None when it cannot be scored."""
    if links is None:
        return None
    y = label_matrix(*scores.shape, links)
    if not y.any() or y.all():
        return None
    return DocMetrics(
        doc_id,
        roc_auc(scores, y),
        precision_at_k(scores, y, 1),
        precision_at_k(scores, y, 5),
        n_sentences=int(scores.shape[0]),
        n_images=int(scores.shape[1]),
        n_links=int(y.sum()),
    )


def summarize(per_doc: list[DocMetrics]) -> dict[str, float]:
    """Macro averages x100 (each document counts once, whatever its size), and ``auc_se``: the
    macro AUC's standard error over the documents (sample sd / sqrt(n), x100; NaN below two): how
    far one run's AUC could move with another draw of documents of the same kind (on the demo's 56
    test documents 0.22: 99.1 is no evidence against 99.3). Not the noise of a difference between two
    models on the same documents (paired: smaller, as ``pick`` reads it) nor between seeds."""
    if not per_doc:
        nan = float("nan")
        return {"auc": nan, "p_at_1": nan, "p_at_5": nan, "n_docs": 0, "auc_se": nan}
    return {
        "auc": 100 * float(np.mean([d.auc for d in per_doc])),
        "p_at_1": 100 * float(np.mean([d.p_at_1 for d in per_doc])),
        "p_at_5": 100 * float(np.mean([d.p_at_5 for d in per_doc])),
        "n_docs": len(per_doc),
        "auc_se": standard_error([100 * d.auc for d in per_doc]),
    }


def standard_error(values: list[float]) -> float:
    """sd(ddof=1) / sqrt(n) of ``values``; NaN for fewer than two."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) >= 2 else float("nan")


def random_per_doc(
    docs: list[tuple[str, int, int, list[tuple[int, int]] | None]], seed: int = 0
) -> list[DocMetrics]:
    """Per-document metrics of uniform random scores for (doc_id, n, m, links) documents."""
    rng = np.random.default_rng(seed)
    per_doc = [document_metrics(d, rng.random((n, m)), lk) for d, n, m, lk in docs]
    return [p for p in per_doc if p is not None]


def random_baseline(docs: list[tuple[str, int, int, list[tuple[int, int]] | None]], seed: int = 0) -> dict:
    """Uniform random scores for (doc_id, n, m, links) documents (the paper's Random row)."""
    return summarize(random_per_doc(docs, seed))


def link_counts(predicted: list[tuple[int, int]], gold: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(true positives, predicted links, true links) of one document's predicted
    (sentence, image) links against its ground truth; duplicates count once."""
    pred, true = set(map(tuple, predicted)), set(map(tuple, gold))
    return len(pred & true), len(pred), len(true)


def link_prf(tp: int, n_pred: int, n_gold: int) -> dict[str, float]:
    """Link-level precision, recall and F1 (x100, micro: every link of every document counts
    once) from summed ``link_counts``; NaN where a denominator is 0."""
    p = 100 * tp / n_pred if n_pred else float("nan")
    r = 100 * tp / n_gold if n_gold else float("nan")
    f1 = (
        2 * p * r / (p + r)
        if n_pred and n_gold and p + r > 0
        else (0.0 if n_pred and n_gold else float("nan"))
    )
    return {"precision": p, "recall": r, "f1": f1, "true_positives": tp, "predicted": n_pred, "gold": n_gold}


def within_document_gap(scores: np.ndarray) -> float | None:
    """How far a document's best one-to-one matching stands above its average cell.

    Unsupervised (no label): the mean of the k = min(n, m) cells of the maximum-weight matching
    minus the mean of all n x m cells. A model that only tells documents apart (by a style shared
    by all a document's images, or topic words shared by all its sentences) scores every cell of a
    document alike, and its gap stays near 0 however low its loss; a model that links inside the
    document opens it. None for a 1 x 1 document (no inside to compare).
    """
    from training.objectives.assignment import max_weight_matching

    scores = np.asarray(scores, dtype=np.float64)
    if scores.size < 2 or not np.isfinite(scores).all():
        return None
    rows, cols = max_weight_matching(scores)
    return float(scores[rows, cols].mean() - scores.mean())


# link_structure's smallest document side: with two sentences or images the double-centred scores are one
# row and its negative, blind to what is linked (2 x 2: always 0; strong links: 2 x 3 ~0.05, 3 x 3 ~0.3).
# Nor could any one-to-one criterion read a 2 x 2: the cells its matching leaves are a matching too (on two
# images a document a trial of balanced centring ranked the links last, validation AUC 3.2)
STRUCTURE_MIN_SIDE = 3


def link_structure(scores: np.ndarray, rng: np.random.Generator, shuffles: int = 8) -> float | None:
    """How much one-to-one structure a document's scores hold beyond chance (label-free, issue #60).

    The n x m scores are double-centred (a sentence's or an image's offset, a document-wide
    style, says nothing about which goes with which), and the mean of the cells of their
    maximum-weight matching is taken in units of their spread: the same number for the raw
    cells shuffled (``shuffles`` draws: the chance level of a model with these cosines) is
    subtracted, so a model that scores a document flat, or at random, lands near 0 whatever n
    and m are, and one that links inside it stands above. That value is then scaled by the centred
    cells' share of the whole spread: an offset (a look lifting every score of its images) pulls
    the document's AUC down, and dilutes the criterion as it does (in the centred cells' units
    alone the bag on two looks a topic tied the GRU, its validation AUC 12 lower; issue #60).
    Scale-free, unlike ``within_document_gap``, so models whose cosines spread differently (the
    GRU and the bag backbone) compare. None where min(n, m) < ``STRUCTURE_MIN_SIDE`` or a score
    is not finite."""
    scores = np.asarray(scores, dtype=np.float64)
    if min(scores.shape, default=0) < STRUCTURE_MIN_SIDE or not np.isfinite(scores).all():
        return None

    from training.objectives.assignment import max_weight_matching

    # the scores, then the raw cells shuffled (what chance gives a model with these cosines), centred
    # and scaled as one stack: per matrix numpy's calls cost more than its small matching (validation
    # scores every document every epoch)
    flat = scores.ravel()
    s = np.stack([scores, *(rng.permutation(flat).reshape(scores.shape) for _ in range(shuffles))])
    c = s - s.mean(2, keepdims=True) - s.mean(1, keepdims=True) + s.mean((1, 2), keepdims=True)
    sd = c.std((1, 2))
    peaks = [x[max_weight_matching(x)].mean() / d if d > 1e-12 else 0.0 for x, d in zip(c, sd, strict=True)]
    whole = scores.std()  # the document's whole spread, offsets and all
    return float((peaks[0] - np.mean(peaks[1:])) * sd[0] / whole) if whole > 1e-12 else 0.0


# Below this mean within-document gap (cosine units, validation documents) in every epoch, a
# run has not learned to link inside documents (docs/benchmarks.md "Confounded documents": runs
# that stay near chance stay at 0.02-0.06; runs that link end at 0.17-0.49).
FLAT_WITHIN_GAP = 0.1


def flat_within_warning(
    history: list[dict], threshold: float = FLAT_WITHIN_GAP, confounds=None
) -> str | None:
    """A one-line warning when the run's within-document signal never rose; else None.

    ``confounds``: the training split's ``pipelines.confounds.SplitConfounds``; when it is
    strongly confounded the warning names the figures, the likeliest cause."""
    gaps = [h["val_within"] for h in history if np.isfinite(h.get("val_within", float("nan")))]
    if not gaps or max(gaps) >= threshold:
        return None
    cause = ""
    if confounds is not None and confounds.strong:
        ratio = "-" if confounds.image_ratio is None else f"{confounds.image_ratio:.1f}"
        share = "-" if confounds.text_share is None else f"{confounds.text_share:.2f}"
        cause = (
            f"; the training split is strongly confounded (image ratio {ratio}, text share {share}: "
            "a document's images share a look, its sentences their topic words)"
        )
    return (
        f"the within-document signal stayed flat (val_within <= {max(gaps):.3f} < {threshold:g} in all "
        f"{len(gaps)} epochs): the model tells documents apart but has not learned which sentence goes "
        f"with which image inside them{cause} (docs/training.md, 'Confounded documents')"
    )
