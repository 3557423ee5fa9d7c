"""Per-document link metrics (AUC, p@k), macro-averaged x100, as in Hessel et al. 2019.

A cell (s, i) is positive if the ground truth links sentence s and image i. Documents with no
positive cell, or with every cell positive, are skipped: AUC is undefined there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata


def label_matrix(n: int, m: int, links: list[tuple[int, int]]) -> np.ndarray:
    y = np.zeros((n, m), dtype=bool)
    for s, i in links:
        y[s, i] = True
    return y


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties (equals the pairwise definition)."""
    scores, labels = np.ravel(scores), np.ravel(labels).astype(bool)
    pos = int(labels.sum())
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        raise ValueError("AUC needs at least one positive and one negative cell")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def precision_at_k(scores: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Fraction of true links among the k highest cells of the flattened matrix."""
    flat_s, flat_y = np.ravel(scores), np.ravel(labels).astype(bool)
    k = min(k, flat_s.size)
    top = np.argsort(-flat_s, kind="stable")[:k]
    return float(flat_y[top].mean())


@dataclass
class DocMetrics:
    doc_id: str
    auc: float
    p_at_1: float
    p_at_5: float


def document_metrics(
    doc_id: str, scores: np.ndarray, links: list[tuple[int, int]] | None
) -> DocMetrics | None:
    if links is None:
        return None
    y = label_matrix(*scores.shape, links)
    if not y.any() or y.all():
        return None
    return DocMetrics(doc_id, roc_auc(scores, y), precision_at_k(scores, y, 1), precision_at_k(scores, y, 5))


def summarize(per_doc: list[DocMetrics]) -> dict[str, float]:
    if not per_doc:
        return {"auc": float("nan"), "p_at_1": float("nan"), "p_at_5": float("nan"), "n_docs": 0}
    return {
        "auc": 100 * float(np.mean([d.auc for d in per_doc])),
        "p_at_1": 100 * float(np.mean([d.p_at_1 for d in per_doc])),
        "p_at_5": 100 * float(np.mean([d.p_at_5 for d in per_doc])),
        "n_docs": len(per_doc),
    }


def random_baseline(docs: list[tuple[str, int, int, list[tuple[int, int]] | None]], seed: int = 0) -> dict:
    """Uniform random scores for (doc_id, n, m, links) documents."""
    rng = np.random.default_rng(seed)
    per_doc = [document_metrics(d, rng.random((n, m)), lk) for d, n, m, lk in docs]
    return summarize([p for p in per_doc if p is not None])
