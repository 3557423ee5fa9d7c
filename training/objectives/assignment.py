"""Exact k-cardinality maximum-weight bipartite matching (the AP similarity's inner problem).

``max_weight_matching`` (SciPy's ``linear_sum_assignment``, the oracle; ``looped_max_weight_matching``
calls it per problem) and ``batched_max_weight_matching`` (vectorised successive shortest paths)
have the same optimum. For k < min(n, m), (min - k) high-value dummy columns absorb rows of the
smaller side (the reference solver's reduction). Why SciPy, not lapjv (until issue #63): ~1-2 us a
small block against lapjv's ~6 us, rectangular blocks as they are, and on the GPU image too."""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linear_sum_assignment


def choose_k(n: int, m: int, mode: str) -> int:
    """``full`` = min(n, m); ``half`` = ceil(min(n, m) / 2)."""
    if mode == "full":
        return min(n, m)
    if mode == "half":
        return math.ceil(min(n, m) / 2)
    raise ValueError(f"k must be 'full' or 'half', not {mode!r}")


def max_weight_matching(weights: np.ndarray, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows and columns of the maximum-weight matching with exactly ``k`` edges.

    ``weights`` is an (n, m) matrix; ``k`` defaults to min(n, m). Returns index arrays sorted by
    row.
    """
    w = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(w).all():
        raise ValueError("matching weights must be finite (NaN or inf found)")
    small = min(w.shape)
    k = small if k is None else k
    if not 0 <= k <= small:
        raise ValueError(f"k={k} outside [0, {small}] for a {w.shape[0]}x{w.shape[1]} matrix")
    return _matching(w, k)


def _matching(w: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``max_weight_matching`` of a checked, finite float64 ``w``."""
    n, m = w.shape
    if k == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if k == min(n, m):  # rows come back sorted
        r, c = linear_sum_assignment(w, maximize=True)
        return r.astype(np.int64), c.astype(np.int64)
    transposed = n > m
    if transposed:  # make rows the smaller side
        w, n, m = w.T, m, n
    aug = np.empty((n, m + n - k))
    aug[:, :m] = w
    aug[:, m:] = 2.0 * float(np.abs(w).max()) + 1.0  # dummy columns absorb exactly n - k rows
    r, c = linear_sum_assignment(aug, maximize=True)
    real = c < m
    r, c = r[real], c[real]
    if transposed:
        r, c = c, r
    order = np.argsort(r, kind="stable")
    return r[order].astype(np.int64), c[order].astype(np.int64)


def _padded_costs(
    weights: np.ndarray, n: np.ndarray, m: np.ndarray, k: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Checked sizes -> ([P, N, M] costs ``top_p - w >= 0``, +inf outside each block; k as int64)."""
    w = np.asarray(weights, dtype=np.float64)
    P, N, M = w.shape
    n, m, k = (np.asarray(x, dtype=np.int64).reshape(P) for x in (n, m, k))
    if np.any((n < 0) | (n > N) | (m < 0) | (m > M)):
        raise ValueError(f"problem sizes must lie inside the padded {N}x{M} matrices")
    if np.any((k < 0) | (k > np.minimum(n, m))):
        raise ValueError("every k must lie in [0, min(n, m)] of its problem")
    valid_row = np.arange(N)[None, :] < n[:, None]
    valid = valid_row[:, :, None] & (np.arange(M)[None, None, :] < m[:, None, None])
    top = np.where(valid, w, -np.inf).max(axis=(1, 2), initial=-np.inf)
    return np.where(valid, np.where(np.isfinite(top), top, 0.0)[:, None, None] - w, np.inf), k


def batched_max_weight_matching(
    weights: np.ndarray, n: np.ndarray, m: np.ndarray, k: np.ndarray
) -> np.ndarray:
    """Maximum-weight ``k[p]``-edge matching of every padded problem, vectorised over problems.

    ``weights`` is [P, N, M] and finite; problem p is its top-left ``n[p] x m[p]`` block (the rest
    is ignored) and needs ``0 <= k[p] <= min(n[p], m[p])``. Returns a boolean [P, N, M] selection
    with exactly ``k[p]`` cells in problem p, at most one per row and column.

    Successive shortest paths (the Hungarian method with every free row as a root): on costs
    ``top_p - w >= 0``, each round finds by Dijkstra on reduced costs the cheapest augmenting path
    from any free row to any free column and flips it. After r rounds the matching is a min-cost
    r-edge matching (the min-cost-flow property of successive shortest paths), so stopping at round
    k solves the k-cardinality problem directly: no dummy nodes, rectangular blocks as they are. The
    potentials keep every free row at distance 0 and all free columns level, so a search ends at
    the first free column it settles. All P problems advance in lockstep (one Dijkstra step is a
    few numpy ops on [P, M] arrays), replacing P Python-level solver calls.

    Cost: lockstep waits for each round's longest search, which grows with the matching, so at
    B = 11 (121 problems of 16 x 16, CPU) this is ~1.1x faster than a loop of SciPy calls for k
    half and ~5x slower for k full (docs/benchmarks.md, "AP's exact solver").
    """
    cost, k = _padded_costs(weights, n, m, k)
    P, N, M = cost.shape
    cost_rows = cost.reshape(P * N, M)
    free_cost = cost.transpose(0, 2, 1).copy()  # [P, M, N]; a row's entries go to +inf once matched
    # potentials: free rows stay at 0 (their distance from the source), so only matched rows move
    pi_row, pi_col = np.zeros(P * N), np.zeros((P, M))
    row_match, col_match = np.full((P, N), -1), np.full((P, M), -1)
    rm, cm = row_match.ravel(), col_match.ravel()  # flat views: problem p, node i -> p * N + i
    base_n, base_m, problems = np.arange(P) * N, np.arange(P) * M, np.arange(P)
    cell = np.arange(P * M).reshape(P, M) * N  # flat offset of free_cost[p, j, 0]
    for r in range(int(k.max(initial=0))):
        active = k > r
        # every free row is a root at distance 0: a column starts at its cheapest edge from one
        pred = free_cost.argmin(axis=2)  # [P, M] row that reached each column
        dist = free_cost.ravel()[cell + pred] - pi_col
        settled = np.zeros((P, M))  # +inf once settled
        searching = active.copy()
        for _ in range(M + 1):  # each step settles one matched column or ends the search
            open_dist = dist + settled
            j = open_dist.argmin(axis=1)
            fj = base_m + j
            i = cm[fj]
            searching &= i >= 0  # the others reached a free column: shortest path found
            if not searching.any():
                break
            settled.ravel()[fj] = np.inf
            # row i, matched to column j, is reached at j's distance along its tight edge
            fi = base_n + i
            dj = np.where(searching, open_dist.ravel()[fj], np.inf) + pi_row[fi]
            relax = dj[:, None] + (cost_rows[fi] - pi_col)
            better = relax + settled < open_dist
            np.copyto(dist, relax, where=better)
            np.copyto(pred, i[:, None], where=better)
        end = np.where(col_match < 0, dist, np.inf).argmin(axis=1)  # the free column found
        # potentials move by min(distance, path length): reduced costs stay >= 0, the path tight
        cap = np.where(active, dist.ravel()[base_m + end], 0.0)[:, None]
        d_row = dist.ravel()[base_m[:, None] + np.maximum(row_match, 0)]
        pi_row += np.where((row_match >= 0) & active[:, None], np.minimum(d_row, cap), 0.0).ravel()
        pi_col += np.where(active[:, None], np.minimum(dist, cap), 0.0)
        # flip the path, walking back from the free column to its free root row
        j, walking, root = end, active.copy(), np.zeros(P, dtype=np.int64)
        for _ in range(r + 1):
            i = np.where(walking, pred.ravel()[base_m + j], 0)
            prev = rm[base_n + i]
            rm[(base_n + i)[walking]] = j[walking]
            cm[(base_m + j)[walking]] = i[walking]
            np.copyto(root, i, where=walking & (prev < 0))
            j, walking = prev, walking & (prev >= 0)
        free_cost[problems[active], :, root[active]] = np.inf
    chosen = np.zeros((P, N, M), dtype=bool)
    p, i = np.nonzero(row_match >= 0)
    chosen[p, i, row_match[p, i]] = True
    return chosen


def looped_max_weight_matching(
    weights: np.ndarray, n: np.ndarray, m: np.ndarray, k: np.ndarray
) -> np.ndarray:
    """``batched_max_weight_matching``'s contract with one SciPy call per problem (a Python loop)."""
    w = np.asarray(weights, dtype=np.float64)
    P, N, M = w.shape
    n, m, k = (np.asarray(x, dtype=np.int64).reshape(P) for x in (n, m, k))
    if np.any((n < 0) | (n > N) | (m < 0) | (m > M)):
        raise ValueError(f"problem sizes must lie inside the padded {N}x{M} matrices")
    if np.any((k < 0) | (k > np.minimum(n, m))):
        raise ValueError("every k must lie in [0, min(n, m)] of its problem")
    chosen = np.zeros((P, N, M), dtype=bool)
    for p in range(P):
        if k[p]:
            r, c = _matching(w[p, : n[p], : m[p]], int(k[p]))
            chosen[p, r, c] = True
    return chosen


# Which exact solver wins, by measurement (benchmarks/assignment.py, docs/benchmarks.md "AP's
# exact solver"): the batched one's problems advance in lockstep, so each round waits for the
# longest search; at k = min(n, m) there are as many rounds as the largest matching, and a loop
# of C calls is faster. With k = half the batched solver stops after half the rounds and
# wins. Both run in numpy on the host (the similarity matrices are copied there first); on a CUDA
# device the AP similarity solves with ``assignment_triton`` instead, on the device.
SOLVERS = {"loop": looped_max_weight_matching, "batched": batched_max_weight_matching}


def pick_solver(n: np.ndarray, m: np.ndarray, k: np.ndarray, device: str = "cpu") -> str:
    """The faster exact solver for these problems: ``loop`` when every k is its problem's
    min(n, m) (k = full), ``batched`` otherwise (k = half). ``device`` is where the similarity
    tensors live; the solvers themselves run on CPU (see ``SOLVERS``)."""
    full = np.array_equal(np.asarray(k), np.minimum(np.asarray(n), np.asarray(m)))
    return "loop" if full else "batched"


def solve_matchings(
    weights: np.ndarray, n: np.ndarray, m: np.ndarray, k: np.ndarray, device: str = "cpu"
) -> np.ndarray:
    """Maximum-weight ``k[p]``-edge matching of every padded problem (the contract of
    ``batched_max_weight_matching``), by the solver ``pick_solver`` measures faster.
    Refuses non-finite weights: a solver's result on NaN is undefined."""
    w = np.asarray(weights)
    n_, m_ = np.asarray(n).reshape(-1), np.asarray(m).reshape(-1)
    inside = (np.arange(w.shape[1]) < n_[:, None])[:, :, None] & (np.arange(w.shape[2]) < m_[:, None])[
        :, None, :
    ]
    if not np.isfinite(w[inside]).all():  # padding outside n x m may hold anything
        raise ValueError("matching weights must be finite (NaN or inf found)")
    return SOLVERS[pick_solver(n, m, k, device)](weights, n, m, k)
