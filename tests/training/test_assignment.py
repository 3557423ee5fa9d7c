"""Exact k-cardinality matching: the SciPy reference and the batched solver against independent
oracles (exhaustive enumeration, scipy's linear_sum_assignment over row subsets)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import linear_sum_assignment

from training.objectives.assignment import (
    batched_max_weight_matching,
    choose_k,
    looped_max_weight_matching,
    max_weight_matching,
    pick_solver,
    solve_matchings,
)

# Every exact solver of the batched contract, the dispatcher that training calls included.
SOLVERS = pytest.mark.parametrize(
    "solver",
    [batched_max_weight_matching, looped_max_weight_matching, solve_matchings],
    ids=["batched", "loop", "dispatch"],
)


def brute_force_best(w: np.ndarray, k: int) -> float:
    n, m = w.shape
    best = -np.inf
    for rows in itertools.combinations(range(n), k):
        for cols in itertools.permutations(range(m), k):
            best = max(best, sum(w[r, c] for r, c in zip(rows, cols)))
    return best


def scipy_best(w: np.ndarray, k: int) -> float:
    """Best k-edge matching: try every k-subset of the smaller side, let scipy pick the partners."""
    if k == 0:
        return 0.0
    if w.shape[0] > w.shape[1]:
        w = w.T
    best = -np.inf
    for rows in itertools.combinations(range(w.shape[0]), k):
        sub = w[list(rows)]
        r, c = linear_sum_assignment(sub, maximize=True)
        best = max(best, sub[r, c].sum())
    return best


def reference_best(w: np.ndarray, k: int) -> float:
    if k == 0:
        return 0.0
    r, c = max_weight_matching(w, k)
    return w[r, c].sum()


# weights: continuous values or a few repeated ones (ties, degenerate optima), signs mixed
values = st.one_of(
    st.floats(-10, 10, allow_nan=False, width=32),
    st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0]),
)
matrices = st.tuples(st.integers(1, 5), st.integers(1, 5)).flatmap(
    lambda s: arrays(np.float64, s, elements=st.floats(-1, 1, allow_nan=False, width=32))
)


@st.composite
def padded_problems(draw, max_side: int = 6):
    """P problems padded to N x M: each with its own n <= N, m <= M and k <= min(n, m); the padding
    holds NaN or huge values, which the solver must ignore."""
    P = draw(st.integers(1, 6))
    N, M = draw(st.integers(1, max_side)), draw(st.integers(1, max_side))
    w = draw(arrays(np.float64, (P, N, M), elements=values))
    n = np.array(draw(st.lists(st.integers(0, N), min_size=P, max_size=P)))
    m = np.array(draw(st.lists(st.integers(0, M), min_size=P, max_size=P)))
    k = [draw(st.integers(0, min(a, b))) for a, b in zip(n.tolist(), m.tolist())]
    pad = draw(st.sampled_from([np.nan, 1e9, -1e9]))
    for p in range(P):
        w[p, n[p] :, :] = pad
        w[p, :, m[p] :] = pad
    return w, n, m, k


def check_selection(chosen: np.ndarray, w: np.ndarray, n, m, k) -> list[float]:
    """Exactly k cells, inside the valid block, at most one per row and column; returns values."""
    out = []
    for p in range(len(w)):
        sel = chosen[p]
        assert sel.sum() == k[p]
        assert not sel[n[p] :].any() and not sel[:, m[p] :].any()
        assert sel.sum(0).max(initial=0) <= 1 and sel.sum(1).max(initial=0) <= 1
        out.append(float(w[p][sel].sum()))
    return out


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
    st.tuples(st.integers(1, 5), st.integers(1, 5)).flatmap(lambda s: arrays(np.float64, s, elements=values)),
    st.data(),
)
def test_the_matching_is_optimal_on_ties_and_large_weights(w, data):
    """Repeated values (degenerate optima) and weights up to 10, where the dummy columns'
    high value must still beat every real edge: k edges, one per row and column, the optimum."""
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


@SOLVERS
@settings(max_examples=150, deadline=None)
@given(padded_problems())
def test_batched_equals_reference_scipy_and_enumeration(solver, problem):
    w, n, m, k = problem
    got = check_selection(solver(w, n, m, k), w, n, m, k)
    for p in range(len(w)):
        block = w[p, : n[p], : m[p]]
        assert got[p] == pytest.approx(reference_best(block, k[p]), abs=1e-9)
        assert got[p] == pytest.approx(scipy_best(block, k[p]), abs=1e-9)
        if max(block.shape) <= 4:
            expected = brute_force_best(block, k[p]) if k[p] else 0.0
            assert got[p] == pytest.approx(expected, abs=1e-9)


@SOLVERS
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 16), st.integers(1, 16), st.booleans())
def test_batched_on_larger_padded_problems(solver, seed, N, M, integer_weights):
    """Up to 16 x 16 with k full (vs scipy directly) and k < min (vs the reference); integer weights give
    many equal-value optima."""
    rng = np.random.default_rng(seed)
    P = 20
    w = rng.integers(-2, 3, (P, N, M)).astype(float) if integer_weights else rng.normal(size=(P, N, M))
    n, m = rng.integers(1, N + 1, P), rng.integers(1, M + 1, P)
    small = np.minimum(n, m)
    k = np.where(np.arange(P) % 2 == 0, small, rng.integers(0, small + 1))
    got = check_selection(solver(w, n, m, k), w, n, m, k)
    for p in range(P):
        block = w[p, : n[p], : m[p]]
        if k[p] == small[p]:
            r, c = linear_sum_assignment(block, maximize=True)
            assert got[p] == pytest.approx(block[r, c].sum(), abs=1e-9)
        assert got[p] == pytest.approx(reference_best(block, k[p]), abs=1e-9)


@SOLVERS
def test_batched_padding_never_enters_the_arithmetic(solver):
    """Weights a few 1e-9 apart next to 1e12 padding: any use of the padding (say, in the cost
    shift) rounds them together and loses the optimum."""
    rng = np.random.default_rng(0)
    P, N = 50, 6
    w = np.full((P, N + 2, N + 2), 1e12)
    w[:, :N, :N] = rng.integers(0, 100, (P, N, N)) * 1e-9
    n = m = np.full(P, N)
    k = np.full(P, 3)
    got = check_selection(solver(w, n, m, k), w, n, m, k)
    for p in range(P):
        assert got[p] == pytest.approx(scipy_best(w[p, :N, :N], 3), abs=1e-12)


@SOLVERS
def test_batched_single_row_or_column_takes_the_largest_entries(solver):
    w = np.array([[[0.1, 0.9, -0.3]], [[0.4, -2.0, 0.8]]])  # two 1 x 3 problems
    chosen = solver(w, [1, 1], [3, 2], [1, 1])
    assert chosen[0].tolist() == [[False, True, False]]
    assert chosen[1].tolist() == [[True, False, False]]  # column 2 is padding in problem 1
    col = solver(w.transpose(0, 2, 1), [3, 2], [1, 1], [1, 1])
    assert (col == chosen.transpose(0, 2, 1)).all()


@SOLVERS
def test_batched_k_zero_and_empty_batch(solver):
    w = np.ones((2, 3, 3))
    assert not solver(w, [3, 0], [3, 2], [0, 0]).any()
    assert solver(np.zeros((0, 2, 2)), [], [], []).shape == (0, 2, 2)


@SOLVERS
def test_batched_rejects_bad_sizes(solver):
    w = np.zeros((1, 2, 3))
    with pytest.raises(ValueError):
        solver(w, [2], [3], [3])  # k > min(n, m)
    with pytest.raises(ValueError):
        solver(w, [3], [3], [1])  # n beyond the padding
    with pytest.raises(ValueError):
        solver(w, [2], [3], [-1])


def test_choose_k():
    assert choose_k(3, 7, "full") == 3
    assert choose_k(5, 7, "half") == 3
    assert choose_k(1, 1, "half") == 1
    with pytest.raises(ValueError):
        choose_k(2, 2, "quarter")


def test_k_out_of_range_is_rejected():
    with pytest.raises(ValueError):
        max_weight_matching(np.zeros((2, 3)), 3)


def test_the_dispatch_picks_the_measured_faster_solver():
    """docs/benchmarks.md, "AP's exact solver": the SciPy loop at k = min(n, m), batched below."""
    n, m = np.array([3, 5, 2]), np.array([4, 2, 2])
    assert pick_solver(n, m, np.minimum(n, m)) == "loop"
    assert pick_solver(n, m, np.minimum(n, m), "cuda") == "loop"
    assert pick_solver(n, m, [2, 1, 1]) == "batched"
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 5, 4))
    for k in (np.minimum(n, m), np.array([2, 1, 1])):
        assert (solve_matchings(w, n, m, k) == looped_max_weight_matching(w, n, m, k)).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_before_any_solver_runs(bad):
    w = np.zeros((1, 3, 3))
    w[0, 1, 2] = bad
    ones = np.array([3])
    with pytest.raises(ValueError, match="finite"):
        solve_matchings(w, ones, ones, ones)
    with pytest.raises(ValueError, match="finite"):
        max_weight_matching(w[0])
