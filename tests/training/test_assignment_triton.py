"""The GPU assignment kernel (``assignment_triton``) against the reference solver, without a GPU.

Triton's interpreter runs the same kernel on CPU tensors, but only when ``TRITON_INTERPRET=1`` is
set before Triton is first imported, so the property tests run in a child pytest started by
``test_the_kernel_under_tritons_interpreter`` (they skip in the parent). The compiled kernel's own
run is on a GPU (``benchmarks/assignment.py --device cuda`` checks the optimum on every row).
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.training.test_assignment import check_selection, padded_problems, reference_best
from training.link import similarity
from training.objectives import assignment_triton

pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
in_child = pytest.mark.skipif(not INTERPRETED, reason="runs in the child pytest under Triton's interpreter")


def solve(w, n, m, k) -> np.ndarray:
    as_t = [torch.as_tensor(np.asarray(x)) for x in (w, n, m, k)]
    return assignment_triton.triton_max_weight_matching(*as_t).numpy()


@in_child
@settings(max_examples=60, deadline=None)
@given(padded_problems(max_side=6))
def test_kernel_finds_the_oracles_optimum(problem):
    """Rectangular both ways (rows the larger side are transposed), k from 0 to min(n, m), ties,
    NaN or +-1e9 in the padding."""
    w, n, m, k = problem
    got = check_selection(solve(w, n, m, k), w, n, m, k)
    for p in range(len(w)):
        assert got[p] == pytest.approx(reference_best(w[p, : n[p], : m[p]], k[p]), abs=1e-9)


@in_child
@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_kernel_on_document_sized_problems(seed, integer_weights):
    """16 x 16 blocks as in training (k full and half), and large weights (the dummies' value
    must still beat every real edge)."""
    rng = np.random.default_rng(seed)
    P, N, M = 6, 16, 16
    w = rng.integers(-2, 3, (P, N, M)).astype(float) if integer_weights else rng.normal(size=(P, N, M)) * 1e3
    n, m = rng.integers(1, N + 1, P), rng.integers(1, M + 1, P)
    small = np.minimum(n, m)
    k = np.where(np.arange(P) % 2 == 0, small, (small + 1) // 2)
    got = check_selection(solve(w, n, m, k), w, n, m, k)
    for p in range(P):
        assert got[p] == pytest.approx(reference_best(w[p, : n[p], : m[p]], k[p]), rel=1e-12, abs=1e-9)


@in_child
def test_kernel_edge_cases():
    """Empty problems, k = 0, a single cell, and an empty batch."""
    w = np.arange(12, dtype=float).reshape(1, 3, 4).repeat(4, axis=0)
    n, m, k = np.array([0, 3, 3, 1]), np.array([4, 0, 4, 1]), np.array([0, 0, 0, 1])
    got = solve(w, n, m, k)
    assert got[:3].sum() == 0 and got[3].sum() == 1 and got[3, 0, 0]
    assert solve(np.zeros((0, 2, 2)), *([np.zeros(0, dtype=int)] * 3)).shape == (0, 2, 2)


@in_child
@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["full", "half"]), st.booleans())
def test_ap_reads_the_similarity_tensor_as_it_is(seed, k_mode, poisoned):
    """``ap_matchings`` on the B x B x n x m einsum view (not contiguous), float32, with NaN/inf
    cells where ``poisoned``: the same optimum as the host path, which solves on nan_to_num'd
    float64 weights."""
    rng = np.random.default_rng(seed)
    B, N, M = 4, 5, 6
    s_mask = torch.as_tensor(np.arange(N)[None, :] < rng.integers(1, N + 1, B)[:, None])
    v_mask = torch.as_tensor(np.arange(M)[None, :] < rng.integers(1, M + 1, B)[:, None])
    s = torch.as_tensor(rng.normal(size=(B, N, 3)), dtype=torch.float32)
    v = torch.as_tensor(rng.normal(size=(B, M, 3)), dtype=torch.float32)
    sims, _ = similarity.pair_matrices(s, s_mask, v, v_mask)
    if poisoned:
        sims = sims.clone()
        sims[0, 1, 0, 0], sims[2, 2, 0, 0] = float("nan"), float("inf")
    n, m = s_mask.sum(1), v_mask.sum(1)
    k = similarity._k_per_pair(n, m, k_mode)
    got = assignment_triton.ap_matchings(sims, n, m, k)
    weights = torch.nan_to_num(sims.double(), nan=0.0, posinf=0.0, neginf=0.0).numpy()
    flat_n, flat_m = n[:, None].expand(B, B).reshape(-1).numpy(), m[None, :].expand(B, B).reshape(-1).numpy()
    values = check_selection(
        got.reshape(B * B, N, M).numpy(), weights.reshape(B * B, N, M), flat_n, flat_m, k.reshape(-1).numpy()
    )
    for p, value in enumerate(values):
        a, b = divmod(p, B)
        block = weights[a, b, : flat_n[p], : flat_m[p]]
        assert value == pytest.approx(reference_best(block, int(k[a, b])), abs=1e-6)


@pytest.mark.skipif(INTERPRETED, reason="the parent of the child run")
def test_the_kernel_under_tritons_interpreter():
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", __file__],
        cwd=root,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = child.stdout[-3000:] + child.stderr[-2000:]
    assert child.returncode == 0, tail
    assert "5 passed, 1 skipped" in child.stdout, tail  # the interpreted tests ran; only this one skips


def test_the_gpu_solver_is_used_only_for_cuda_tensors():
    assert not assignment_triton.available("cpu")
    with pytest.raises(ValueError, match="AP solver"):
        similarity.ap(
            torch.zeros(1, 1, 1, 1),
            None,
            torch.ones(1, 1, dtype=torch.bool),
            torch.ones(1, 1, dtype=torch.bool),
            solver="gpu",
        )
    if not INTERPRETED:
        with pytest.raises(RuntimeError, match="CUDA tensors"):
            solve(np.zeros((1, 2, 2)), [2], [2], [2])
