import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import linear_sum_assignment

from training.objectives.assignment import choose_k, max_weight_matching


def brute_force_best(w: np.ndarray, k: int) -> float:
    n, m = w.shape
    best = -np.inf
    for rows in itertools.combinations(range(n), k):
        for cols in itertools.permutations(range(m), k):
            best = max(best, sum(w[r, c] for r, c in zip(rows, cols)))
    return best


matrices = st.tuples(st.integers(1, 5), st.integers(1, 5)).flatmap(
    lambda s: arrays(np.float64, s, elements=st.floats(-1, 1, allow_nan=False, width=32))
)


@settings(max_examples=200, deadline=None)
@given(matrices, st.data())
def test_matching_value_equals_brute_force(w, data):
    k = data.draw(st.integers(0, min(w.shape)))
    rows, cols = max_weight_matching(w, k)
    assert len(rows) == len(cols) == k
    assert len(set(rows.tolist())) == k and len(set(cols.tolist())) == k
    if k:
        assert w[rows, cols].sum() == pytest.approx(brute_force_best(w, k), abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    st.tuples(st.integers(1, 12), st.integers(1, 12)).flatmap(
        lambda s: arrays(np.float64, s, elements=st.floats(-1, 1, allow_nan=False, width=32))
    )
)
def test_full_k_matches_scipy_on_larger_matrices(w):
    rows, cols = max_weight_matching(w)
    r, c = linear_sum_assignment(w, maximize=True)
    assert w[rows, cols].sum() == pytest.approx(w[r, c].sum(), abs=1e-9)


def test_choose_k():
    assert choose_k(3, 7, "full") == 3
    assert choose_k(5, 7, "half") == 3
    assert choose_k(1, 1, "half") == 1
    with pytest.raises(ValueError):
        choose_k(2, 2, "quarter")


def test_k_out_of_range_is_rejected():
    with pytest.raises(ValueError):
        max_weight_matching(np.zeros((2, 3)), 3)
