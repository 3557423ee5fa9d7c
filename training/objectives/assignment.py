"""Exact k-cardinality maximum-weight bipartite matching (the AP similarity's inner problem).

The reduction follows the reference solver: for k < min(n, m), add (min - k) dummy nodes of a
high value that can only absorb nodes of the smaller side, pad to square with a constant, and
solve one linear assignment with lapjv (which minimises cost on square matrices). Every dummy is
used (each is worth more than any real edge), so exactly k real nodes of the smaller side remain,
and they get the best k-edge matching among all real pairs. Padding rows are constant, so they
never change which real pairs win. The constants are kept near the weights' scale and lapjv runs
in float64: its float32 default cannot tell 1e4 + 1e-5 from 1e4.
"""

from __future__ import annotations

import math

import lapjv
import numpy as np


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
    n, m = w.shape
    small = min(n, m)
    k = small if k is None else k
    if not 0 <= k <= small:
        raise ValueError(f"k={k} outside [0, {small}] for a {n}x{m} matrix")
    if k == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    transposed = n > m
    if transposed:  # make rows the smaller side
        w, n, m = w.T, m, n
    dummies = n - k
    cols = m + dummies
    size = max(n, cols)
    high = 2.0 * float(np.abs(w).max()) + 1.0  # beats any real edge and the constant padding
    aug = np.zeros((size, size))
    aug[:n, :m] = w
    aug[:n, m:cols] = high  # dummy columns absorb exactly n - k real rows
    if size == 1:
        row_to_col = np.zeros(1, dtype=np.int64)
    else:
        row_to_col = np.asarray(lapjv.lapjv(-aug, force_doubles=True)[0])
    rows = np.arange(n)
    chosen = row_to_col[:n]
    real = chosen < m
    r, c = rows[real], chosen[real]
    if transposed:
        r, c = c, r
    order = np.argsort(r, kind="stable")
    return r[order].astype(np.int64), c[order].astype(np.int64)
