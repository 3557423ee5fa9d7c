"""Ranking metrics of text-to-image retrieval: MedR and R@K over pools, per relation subset, and
relation AP (in the core because the news family reports them too).

Conventions are docs/evaluation.md's: column i is text i's true image, disjoint pools, 1-based
ranks with ``pessimistic`` ties by default (a constant model gets rank N, never a lucky 1)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

TIES = ("pessimistic", "fair")
KS = (1, 5, 10)
# the promotion gate's fixed pools (a registered retrieval or news model and its candidate are
# scored on the same ones)
GATE_POOL_SIZE, GATE_POOLS = 500, 10


def rank_counts(sim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sim [Q, Q], true candidate of row i in column i -> (higher [Q], tied [Q]): how many other
    candidates score strictly above / exactly equal to the true one."""
    sim = np.asarray(sim, dtype=np.float64)
    if sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
        raise ValueError(f"a square query x candidate matrix is needed, not shape {sim.shape}")
    if not np.isfinite(sim).all():
        raise ValueError("similarities must be finite (a diverged model?)")
    true = np.diag(sim)[:, None]
    higher = (sim > true).sum(1)
    tied = (sim == true).sum(1) - 1  # the true candidate itself is not a tie
    return higher, tied


def ranks(sim: np.ndarray, tie: str = "pessimistic") -> np.ndarray:
    """1-based rank of each query's true candidate (float: fair ties give half ranks)."""
    higher, tied = rank_counts(sim)
    if tie == "pessimistic":
        return (1 + higher + tied).astype(np.float64)
    if tie == "fair":
        return 1 + higher + tied / 2
    raise ValueError(f"tie must be one of {TIES}, not {tie!r}")


def recall_at(sim: np.ndarray, k: int, tie: str = "pessimistic", queries: np.ndarray | None = None) -> float:
    """100 x share of queries whose true candidate ranks within the top k."""
    higher, tied = rank_counts(sim)
    if tie == "pessimistic":
        hit = (1 + higher + tied <= k).astype(np.float64)
    elif tie == "fair":  # rank uniform on higher+1 .. higher+tied+1
        hit = np.clip((k - higher) / (tied + 1), 0.0, 1.0)
    else:
        raise ValueError(f"tie must be one of {TIES}, not {tie!r}")
    if queries is not None:
        hit = hit[queries]
    return float(100 * hit.mean()) if len(hit) else float("nan")


def pool_metrics(
    sim: np.ndarray, tie: str = "pessimistic", ks: Sequence[int] = KS, queries: np.ndarray | None = None
) -> dict[str, float] | None:
    """MedR and R@K of one pool (``queries``: a boolean mask of the rows that count); None when
    no query counts."""
    r = ranks(sim, tie)
    if queries is not None:
        queries = np.asarray(queries, dtype=bool)
        if not queries.any():
            return None
    out = {"medr": float(np.median(r if queries is None else r[queries]))}
    for k in ks:
        out[f"r{k}"] = recall_at(sim, k, tie, queries)
    return out


def pools(n: int, pool_size: int = 500, n_pools: int = 10, seed: int = 0) -> list[np.ndarray]:
    """Index sets (sorted) of ``min(n_pools, n // pool_size)`` disjoint pools of ``pool_size``
    (a seeded permutation cut in pieces), or one pool of everything when ``n <= pool_size``."""
    if n < 2:
        raise ValueError(f"retrieval needs at least 2 pairs, not {n}")
    if pool_size < 2 or n_pools < 1:
        raise ValueError("pool_size >= 2 and n_pools >= 1 are needed")
    if n <= pool_size:
        return [np.arange(n)]
    order = np.random.default_rng(seed).permutation(n)
    fit = min(n_pools, n // pool_size)
    return [np.sort(order[k * pool_size : (k + 1) * pool_size]) for k in range(fit)]


def _average(rows: list[dict[str, float]], pool_size: int) -> dict[str, float]:
    if not rows:
        return {"medr": float("nan"), "pools": 0}
    out = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    # one pool has no spread to report (0 would read as "no variation")
    out["medr_std"] = float(np.std([r["medr"] for r in rows])) if len(rows) > 1 else float("nan")
    out["medr_frac"] = out["medr"] / pool_size
    out["pools"] = len(rows)
    out["pool_size"] = pool_size
    return out


def retrieval_metrics(
    sim: np.ndarray | None = None,
    *,
    n: int | None = None,
    score_pool: Callable[[np.ndarray], np.ndarray] | None = None,
    pool_size: int = 500,
    n_pools: int = 10,
    seed: int = 0,
    tie: str = "pessimistic",
    ks: Sequence[int] = KS,
    labels: np.ndarray | None = None,
    relation_names: Sequence[str] = (),
) -> dict:
    """Text-to-image and image-to-text MedR and R@K averaged over pools.

    Give ``sim`` [M, M] (text x image), or ``n`` and ``score_pool(index array) -> [P, P]`` (the
    text x image scores of one pool, e.g. after selective refinement, which depends on the pool).
    ``labels`` [M, C] (0/1) with ``relation_names`` adds text-to-image metrics per relation
    subset. Returns {"t2i": {...}, "i2t": {...}, "relations": {name: {...}}}.
    """
    if sim is not None:
        sim = np.asarray(sim)
        n = sim.shape[0]
        score_pool = lambda idx: sim[np.ix_(idx, idx)]
    if n is None or score_pool is None:
        raise ValueError("give sim, or n and score_pool")
    index_sets = pools(n, pool_size, n_pools, seed)
    size = len(index_sets[0])
    t2i, i2t = [], []
    per_rel: dict[str, list] = {name: [] for name in relation_names}
    for idx in index_sets:
        s = score_pool(idx)
        t2i.append(pool_metrics(s, tie, ks))
        i2t.append(pool_metrics(s.T, tie, ks))
        if labels is not None:
            lab = np.asarray(labels)[idx]
            for c, name in enumerate(relation_names):
                m = pool_metrics(s, tie, ks, queries=lab[:, c] > 0)
                if m is not None:
                    per_rel[name].append(m)
    out = {"t2i": _average(t2i, size), "i2t": _average(i2t, size)}
    if labels is not None:
        out["relations"] = {name: _average(rows, size) for name, rows in per_rel.items()}
    return out


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Average precision of one relation's predicted probabilities (the paper's Table 8):
    sum over distinct score thresholds, from high to low, of (recall gain) x precision, where
    every item scoring >= the threshold is predicted positive, so tied items enter together.
    scikit-learn's ``average_precision_score`` computes it; NaN when there is no positive
    (scikit-learn would warn and return 0), ValueError when the lengths differ."""
    from sklearn.metrics import average_precision_score  # ~1.2 s to import cold: only when evaluated

    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).ravel() > 0
    if scores.shape != labels.shape:
        raise ValueError("scores and labels differ in length")
    if not labels.any():
        return float("nan")
    return float(average_precision_score(labels.astype(np.int8), scores))


def relation_average_precision(
    probs: np.ndarray, labels: np.ndarray, relation_names: Sequence[str]
) -> dict[str, float]:
    """probs, labels [M, C] of the true pairs -> {relation: AP}."""
    probs, labels = np.asarray(probs), np.asarray(labels)
    return {name: average_precision(probs[:, c], labels[:, c]) for c, name in enumerate(relation_names)}
