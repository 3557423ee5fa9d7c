"""Both assignment modes against brute force on small matrices, padded batches included."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from linking.assign import UNLINKED, assign_links, pad_scores

finite = st.floats(-1, 1, allow_nan=False, width=32)
matrices = st.tuples(st.integers(1, 4), st.integers(1, 4)).flatmap(
    lambda s: arrays(np.float64, s, elements=finite)
)


def best_matching_weight(w: np.ndarray) -> float:
    """Enumerate every matching with min(n, m) edges: the maximum total weight."""
    n, m = w.shape
    if n >= m:  # each image a distinct sentence
        return max(sum(w[p[j], j] for j in range(m)) for p in itertools.permutations(range(n), m))
    return max(sum(w[i, p[i]] for i in range(n)) for p in itertools.permutations(range(m), n))


@settings(max_examples=150, deadline=None)
@given(st.lists(matrices, min_size=1, max_size=4))
def test_matching_is_one_to_one_and_optimal(mats):
    padded, n, m = pad_scores(mats)
    sentence, score = assign_links(padded, n, m, "matching", float("-inf"))
    for b, w in enumerate(mats):
        s = sentence[b, : m[b]]
        linked = s[s != UNLINKED]
        assert len(linked) == min(w.shape) and len(set(linked.tolist())) == len(linked)  # one-to-one
        total = sum(w[s[j], j] for j in range(m[b]) if s[j] != UNLINKED)
        assert total == pytest.approx(best_matching_weight(w), abs=1e-9)
        np.testing.assert_allclose(score[b, : m[b]][s != UNLINKED], w[linked, np.flatnonzero(s != UNLINKED)])
        assert (sentence[b, m[b] :] == UNLINKED).all()  # padding images never link


@settings(max_examples=150, deadline=None)
@given(st.lists(matrices, min_size=1, max_size=4))
def test_argmax_takes_each_images_best_sentence(mats):
    padded, n, m = pad_scores(mats)
    sentence, score = assign_links(padded, n, m, "argmax", float("-inf"))
    for b, w in enumerate(mats):
        s = sentence[b, : m[b]]
        assert (s >= 0).all() and (s < n[b]).all()  # padded sentences are never chosen
        np.testing.assert_array_equal(score[b, : m[b]], w.max(axis=0))
        np.testing.assert_array_equal(w[s, np.arange(m[b])], w.max(axis=0))


@settings(max_examples=100, deadline=None)
@given(st.lists(matrices, min_size=1, max_size=3), finite, st.sampled_from(["matching", "argmax"]))
def test_min_score_unlinks_exactly_the_weak_links(mats, threshold, mode):
    padded, n, m = pad_scores(mats)
    all_s, all_score = assign_links(padded, n, m, mode, float("-inf"))
    s, score = assign_links(padded, n, m, mode, threshold)
    keep = (all_s != UNLINKED) & (all_score >= threshold)
    np.testing.assert_array_equal(s, np.where(keep, all_s, UNLINKED))
    assert np.isnan(score[~keep]).all() and (score[keep] >= threshold).all()


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="assign must be one of"):
        assign_links(np.zeros((1, 1, 1)), np.array([1]), np.array([1]), "greedy", 0.0)
