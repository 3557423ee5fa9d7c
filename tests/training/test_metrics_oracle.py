"""Every metric against an independent brute-force computation (hypothesis property tests).

The oracles use only the definitions in docs/evaluation.md: AUC as the fraction of
(positive, negative) cell pairs ranked correctly, ties counting 1/2; p@k as the mean, over
every order of the cells that is sorted by descending score (i.e. every way of breaking ties),
of the share of links among the first min(k, n*m) cells.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from training.metrics import average_ranks, document_metrics, label_matrix, precision_at_k, roc_auc, summarize

TIE_PRONE = st.sampled_from([-1.0, -0.25, 0.0, 0.25, 0.5, 1.0])


@st.composite
def scored_documents(draw, max_cells: int = 30, values=TIE_PRONE):
    n = draw(st.integers(1, 6))
    m = draw(st.integers(1, max(1, max_cells // n)))
    scores = np.array(draw(st.lists(values, min_size=n * m, max_size=n * m)), dtype=np.float64).reshape(n, m)
    labels = np.array(draw(st.lists(st.booleans(), min_size=n * m, max_size=n * m))).reshape(n, m)
    return scores, labels


def brute_auc(scores: np.ndarray, labels: np.ndarray) -> Fraction:
    cells = list(zip(scores.ravel().tolist(), labels.ravel().tolist(), strict=True))
    pos = [s for s, y in cells if y]
    neg = [s for s, y in cells if not y]
    wins = sum(Fraction(1) if p > q else Fraction(1, 2) if p == q else Fraction(0) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def brute_precision_at_k(scores: np.ndarray, labels: np.ndarray, k: int) -> Fraction:
    """Average over every tie-breaking order (all permutations sorted by descending score)."""
    s, y = scores.ravel().tolist(), labels.ravel().tolist()
    k = min(k, len(s))
    total, count = Fraction(0), 0
    for order in itertools.permutations(range(len(s))):
        if all(s[a] >= s[b] for a, b in itertools.pairwise(order)):
            total += Fraction(sum(y[c] for c in order[:k]), k)
            count += 1
    return total / count


@settings(max_examples=300, deadline=None)
@given(scored_documents())
def test_auc_matches_the_pairwise_definition(doc):
    scores, labels = doc
    if labels.all() or not labels.any():
        with pytest.raises(ValueError):
            roc_auc(scores, labels)
        return
    assert roc_auc(scores, labels) == pytest.approx(float(brute_auc(scores, labels)), abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(scored_documents(max_cells=7), st.integers(1, 10))
def test_precision_at_k_is_the_mean_over_tie_orders(doc, k):
    scores, labels = doc  # at most 7 cells: 5040 orders to enumerate
    expected = brute_precision_at_k(scores, labels, k)
    assert precision_at_k(scores, labels, k) == pytest.approx(float(expected), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(scored_documents(values=st.floats(-1, 1, allow_nan=False)), st.integers(1, 40))
def test_precision_at_k_without_ties_is_a_plain_sort(doc, k):
    scores, labels = doc
    assume(len(set(scores.ravel().tolist())) == scores.size)
    ranked = sorted(zip(scores.ravel().tolist(), labels.ravel().tolist(), strict=True), reverse=True)
    top = ranked[: min(k, scores.size)]  # k > n*m: every cell
    assert precision_at_k(scores, labels, k) == pytest.approx(sum(y for _, y in top) / len(top))


@settings(max_examples=200, deadline=None)
@given(scored_documents())
def test_document_metrics_and_macro_average(doc):
    scores, labels = doc
    links = [tuple(map(int, c)) for c in np.argwhere(labels)]
    assert np.array_equal(label_matrix(*scores.shape, links), labels)
    m = document_metrics("d", scores, links)
    if labels.all() or not labels.any():
        assert m is None
        return
    assert m.auc == pytest.approx(float(brute_auc(scores, labels)))
    assert (m.n_sentences, m.n_images, m.n_links) == (*scores.shape, int(labels.sum()))
    other = document_metrics("e", -scores, links)  # reversed ranking: AUC mirrors around 1/2
    assert other.auc == pytest.approx(1 - m.auc)
    s = summarize([m, other])
    assert s["auc"] == pytest.approx(50.0)
    assert s["p_at_1"] == pytest.approx(50 * (m.p_at_1 + other.p_at_1))
    assert s["n_docs"] == 2
    # two documents' AUC: sd(ddof=1) / sqrt(2) is half their difference (x100)
    assert s["auc_se"] == pytest.approx(50 * abs(m.auc - other.auc))
    assert np.isnan(summarize([m])["auc_se"]) and np.isnan(summarize([])["auc_se"])


def test_constant_scores_get_the_link_rate_not_the_first_cell():
    labels = np.array([[True, False, False], [False, False, False]])
    scores = np.zeros((2, 3))
    assert roc_auc(scores, labels) == 0.5
    assert precision_at_k(scores, labels, 1) == pytest.approx(1 / 6)  # not 1.0 for cell (0, 0)
    assert precision_at_k(scores, labels, 5) == pytest.approx(1 / 6)


def test_nan_scores_give_nan():
    labels = np.array([[True, False]])
    scores = np.array([[np.nan, 0.0]])
    assert np.isnan(roc_auc(scores, labels)) and np.isnan(precision_at_k(scores, labels, 1))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(TIE_PRONE, st.floats(allow_nan=False, width=32), st.sampled_from([-0.0, float("inf")])),
        max_size=40,
    )
)
def test_average_ranks_equal_scipys_rankdata(values):
    from scipy.stats import rankdata  # the oracle; the module avoids importing scipy.stats

    np.testing.assert_array_equal(average_ranks(np.array(values)), rankdata(values) if values else [])
