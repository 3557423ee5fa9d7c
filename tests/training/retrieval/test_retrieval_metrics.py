"""Retrieval metrics against brute-force oracles (hypothesis), ties included.

The oracles follow the definitions in training/ranking.py: the pessimistic rank is
the true item's position when every tie is ordered before it; the fair rank and R@K are the
mean over every candidate order sorted by descending score (every way of breaking ties).
"""

from __future__ import annotations

import itertools
import statistics
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.ranking import (
    average_precision,
    pool_metrics,
    pools,
    ranks,
    recall_at,
    relation_average_precision,
    retrieval_metrics,
)

TIE_PRONE = st.sampled_from([-1.0, -0.5, 0.0, 0.25, 0.5, 1.0])


@st.composite
def square(draw, max_n: int = 5, values=TIE_PRONE):
    n = draw(st.integers(2, max_n))
    return np.array(draw(st.lists(values, min_size=n * n, max_size=n * n)), dtype=np.float64).reshape(n, n)


def sorted_orders(row: np.ndarray):
    """Every order of the candidates that is sorted by descending score."""
    for perm in itertools.permutations(range(len(row))):
        if all(row[perm[a]] >= row[perm[a + 1]] for a in range(len(perm) - 1)):
            yield perm


def brute_ranks(sim: np.ndarray, tie: str) -> list[Fraction]:
    out = []
    for i, row in enumerate(sim):
        if tie == "pessimistic":
            order = sorted(range(len(row)), key=lambda j, i=i, row=row: (-row[j], j == i))
            out.append(Fraction(order.index(i) + 1))
        else:
            positions = [perm.index(i) + 1 for perm in sorted_orders(row)]
            out.append(Fraction(sum(positions), len(positions)))
    return out


def brute_recall(sim: np.ndarray, k: int, tie: str) -> Fraction:
    hits = []
    for i, row in enumerate(sim):
        if tie == "pessimistic":
            order = sorted(range(len(row)), key=lambda j, i=i, row=row: (-row[j], j == i))
            hits.append(Fraction(int(order.index(i) < k)))
        else:
            orders = list(sorted_orders(row))
            hits.append(Fraction(sum(perm.index(i) < k for perm in orders), len(orders)))
    return 100 * sum(hits) / len(hits)


@settings(max_examples=60, deadline=None)
@given(square(), st.sampled_from(["pessimistic", "fair"]), st.integers(1, 6))
def test_ranks_medr_and_recall_match_brute_force(sim, tie, k):
    expected = brute_ranks(sim, tie)
    assert ranks(sim, tie).tolist() == pytest.approx([float(r) for r in expected])
    assert recall_at(sim, k, tie) == pytest.approx(float(brute_recall(sim, k, tie)))
    m = pool_metrics(sim, tie, ks=(k,))
    assert m["medr"] == pytest.approx(float(statistics.median(expected)))
    assert m[f"r{k}"] == pytest.approx(float(brute_recall(sim, k, tie)))


@settings(max_examples=30, deadline=None)
@given(square(max_n=5), st.lists(st.booleans(), min_size=5, max_size=5))
def test_subset_metrics_count_only_the_subset_queries(sim, mask):
    mask = np.array(mask[: len(sim)])
    m = pool_metrics(sim, "pessimistic", ks=(1,), queries=mask)
    if not mask.any():
        assert m is None
        return
    r = brute_ranks(sim, "pessimistic")
    chosen = [float(x) for x, q in zip(r, mask, strict=True) if q]
    assert m["medr"] == pytest.approx(statistics.median(chosen))
    assert m["r1"] == pytest.approx(100 * np.mean([x <= 1 for x in chosen]))


def test_constant_scores_are_not_lucky():
    sim = np.zeros((4, 4))
    assert ranks(sim).tolist() == [4, 4, 4, 4]  # pessimistic: every tie ranks above
    assert ranks(sim, "fair").tolist() == [2.5] * 4
    assert recall_at(sim, 1, "fair") == pytest.approx(25.0)
    with pytest.raises(ValueError, match="finite"):
        ranks(np.array([[np.nan, 0], [0, 1.0]]))


def test_pools_are_seeded_draws_without_replacement():
    a, b = pools(50, pool_size=10, n_pools=3, seed=1), pools(50, pool_size=10, n_pools=3, seed=1)
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert all(len(set(p.tolist())) == 10 for p in a)
    assert [p.tolist() for p in pools(7, pool_size=10)] == [list(range(7))]


@given(
    n=st.integers(2, 400), pool_size=st.integers(2, 60), n_pools=st.integers(1, 12), seed=st.integers(0, 99)
)
def test_pools_never_overlap_and_as_many_fit_as_the_split_holds(n, pool_size, n_pools, seed):
    """Disjoint pools: no pair is in two pools, so the spread over pools is that of independent
    samples; min(n_pools, n // pool_size) of them (one pool of everything for n <= pool_size)."""
    drawn = pools(n, pool_size, n_pools, seed)
    everything = np.concatenate(drawn)
    assert len(everything) == len(set(everything.tolist()))  # disjoint
    assert everything.min() >= 0 and everything.max() < n
    assert len(drawn) == (1 if n <= pool_size else min(n_pools, n // pool_size))
    if n <= pool_size:
        assert [p.tolist() for p in drawn] == [list(range(n))]
    else:
        assert len(drawn) == min(n_pools, n // pool_size)
        assert all(len(p) == pool_size for p in drawn)


def test_one_pool_reports_no_spread():
    """600 pairs hold one disjoint pool of 500: its MedR has no spread to report (NaN, not 0)."""
    sim = np.random.default_rng(0).normal(size=(600, 600))
    out = retrieval_metrics(sim, pool_size=500, n_pools=10)
    assert out["t2i"]["pools"] == 1 and np.isnan(out["t2i"]["medr_std"])
    out = retrieval_metrics(sim, pool_size=200, n_pools=10)
    assert out["t2i"]["pools"] == 3 and out["t2i"]["medr_std"] > 0


def test_metrics_average_over_pools_and_directions():
    rng = np.random.default_rng(0)
    sim = rng.normal(size=(40, 40)) + 2 * np.eye(40)
    labels = (rng.random((40, 2)) < 0.5).astype(int)
    out = retrieval_metrics(sim, pool_size=10, n_pools=4, seed=3, labels=labels, relation_names=("a", "b"))
    per_pool = [pool_metrics(sim[np.ix_(p, p)]) for p in pools(40, 10, 4, 3)]
    assert out["t2i"]["medr"] == pytest.approx(np.mean([m["medr"] for m in per_pool]))
    assert out["t2i"]["r5"] == pytest.approx(np.mean([m["r5"] for m in per_pool]))
    assert out["t2i"]["medr_frac"] == pytest.approx(out["t2i"]["medr"] / 10)
    i2t = [pool_metrics(sim[np.ix_(p, p)].T) for p in pools(40, 10, 4, 3)]
    assert out["i2t"]["r1"] == pytest.approx(np.mean([m["r1"] for m in i2t]))
    assert set(out["relations"]) == {"a", "b"}
    # a score_pool callback sees each pool's indices
    seen = []
    retrieval_metrics(
        n=40, score_pool=lambda idx: seen.append(idx) or sim[np.ix_(idx, idx)], pool_size=10, n_pools=4
    )
    assert len(seen) == 4


def brute_ap(scores, labels) -> Fraction:
    pos = sum(labels)
    total, prev_recall = Fraction(0), Fraction(0)
    for t in sorted(set(scores), reverse=True):
        chosen = [y for s, y in zip(scores, labels, strict=True) if s >= t]
        tp = sum(chosen)
        recall = Fraction(tp, pos)
        total += (recall - prev_recall) * Fraction(tp, len(chosen))
        prev_recall = recall
    return total


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.1, 0.5, 0.7, 0.9, 1.0]), st.booleans()), min_size=1, max_size=12
    )
)
def test_average_precision_matches_brute_force_and_sklearn(items):
    scores = [s for s, _ in items]
    labels = [int(y) for _, y in items]
    if not any(labels):
        assert np.isnan(average_precision(scores, labels))
        return
    assert average_precision(scores, labels) == pytest.approx(float(brute_ap(scores, labels)))
    from sklearn.metrics import average_precision_score

    assert average_precision(scores, labels) == pytest.approx(average_precision_score(labels, scores))


def test_relation_average_precision_names_each_column():
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])
    labels = np.array([[1, 0], [0, 1], [1, 0]])
    assert relation_average_precision(probs, labels, ("x", "y")) == {"x": 1.0, "y": 1.0}
