"""The batched similarities and the loss against direct per-pair implementations of
algorithms.md."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.data import pad_documents
from training.link.loss import in_batch_loss
from training.link.similarity import ap, document_similarity, pair_matrices
from training.objectives.assignment import max_weight_matching


def oracle_sim(kind: str, M: np.ndarray, k_mode: str) -> float:
    n, m = M.shape
    k = min(n, m) if k_mode == "full" else math.ceil(min(n, m) / 2)
    if kind == "dc":
        return M.max(1).mean() + M.max(0).mean()
    if kind == "tk":
        return np.sort(M.max(1))[::-1][:k].mean() + np.sort(M.max(0))[::-1][:k].mean()
    r, c = max_weight_matching(M, k)
    return M[r, c].mean()


def random_batch(rng, B, max_n, max_m, d=6, ties=False):
    """Unit vectors; with ``ties`` every vector is one of 3, so many cells share a value."""
    ns = rng.integers(1, max_n + 1, B).tolist()
    ms = rng.integers(1, max_m + 1, B).tolist()
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    s = torch.nn.functional.normalize(torch.randn(sum(ns), d, dtype=torch.float64, generator=gen), dim=-1)
    v = torch.nn.functional.normalize(torch.randn(sum(ms), d, dtype=torch.float64, generator=gen), dim=-1)
    if ties:
        pool = torch.cat([s, v])[:3]
        s, v = pool[rng.integers(0, len(pool), len(s))], pool[rng.integers(0, len(pool), len(v))]
    return s, ns, v, ms


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(1, 6),
    st.sampled_from(["dc", "tk", "ap"]),
    st.sampled_from(["full", "half"]),
    st.booleans(),
)
def test_batched_similarity_matches_per_pair_oracle(seed, B, kind, k_mode, ties):
    """Padded, rectangular batches (1..8 sentences x 1..8 images per document) against a plain
    loop over the B x B pairs; for AP that loop is the per-problem SciPy solver."""
    rng = np.random.default_rng(seed)
    s, ns, v, ms = random_batch(rng, B, 8, 8, ties=ties)
    sp, smask = pad_documents(s, ns)
    vp, vmask = pad_documents(v, ms)
    got = document_similarity(kind, sp, smask, vp, vmask, k_mode).numpy()
    so = np.cumsum([0, *ns])
    vo = np.cumsum([0, *ms])
    for a in range(B):
        for b in range(B):
            M = (s[so[a] : so[a + 1]] @ v[vo[b] : vo[b + 1]].T).numpy()
            assert got[a, b] == pytest.approx(oracle_sim(kind, M, k_mode), abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.sampled_from(["full", "half"]))
def test_ap_gradient_is_one_over_k_on_an_optimal_matching_and_zero_elsewhere(seed, B, k_mode):
    rng = np.random.default_rng(seed)
    s, ns, v, ms = random_batch(rng, B, 7, 7)
    sp, smask = pad_documents(s, ns)
    vp, vmask = pad_documents(v, ms)
    sims, valid = pair_matrices(sp, smask, vp, vmask)
    sims = sims.detach().requires_grad_()
    ap(sims, valid, smask, vmask, k_mode).sum().backward()
    grad = sims.grad.numpy()
    for a in range(B):
        for b in range(B):
            n, m = ns[a], ms[b]
            k = min(n, m) if k_mode == "full" else math.ceil(min(n, m) / 2)
            g = grad[a, b]
            picked = g != 0
            assert not picked[n:].any() and not picked[:, m:].any()  # nothing on padding
            assert picked.sum() == k and np.allclose(g[picked], 1 / k)
            assert picked.sum(0).max() <= 1 and picked.sum(1).max() <= 1
            M = sims.detach()[a, b, :n, :m].numpy()
            r, c = max_weight_matching(M, k)
            assert M[picked[:n, :m]].sum() == pytest.approx(M[r, c].sum(), abs=1e-9)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["dc", "tk", "ap"]), st.sampled_from(["full", "half"]))
def test_padding_content_changes_nothing(seed, kind, k_mode):
    """Garbage in the padded slots of the embeddings leaves every similarity and every gradient on
    real vectors unchanged, and gets no gradient itself."""
    rng = np.random.default_rng(seed)
    s, ns, v, ms = random_batch(rng, 4, 6, 6)
    sp, smask = pad_documents(s, ns)
    vp, vmask = pad_documents(v, ms)
    results = []
    for garbage in (0.0, 5.0):
        sg = torch.where(smask[..., None], sp, garbage).requires_grad_()
        vg = torch.where(vmask[..., None], vp, -garbage).requires_grad_()
        out = document_similarity(kind, sg, smask, vg, vmask, k_mode)
        out.sum().backward()
        assert not sg.grad[~smask].any() and not vg.grad[~vmask].any()
        results.append((out.detach(), sg.grad, vg.grad))
    for x, y in zip(*results):
        assert torch.allclose(x, y, atol=1e-12)


def test_unknown_k_mode_is_rejected():
    s = torch.ones(2, 1, 3)
    mask = torch.ones(2, 1, dtype=torch.bool)
    for kind in ("tk", "ap"):
        with pytest.raises(ValueError):
            document_similarity(kind, s, mask, s, mask, "quarter")


def test_ap_gradient_flows_only_through_matched_cells():
    M = torch.tensor([[[[0.9, 0.1, 0.0], [0.8, 0.7, 0.2]]]], requires_grad=True)
    mask_s = torch.tensor([[True, True]])
    mask_v = torch.tensor([[True, True, True]])
    sim = document_similarity("ap", M[0, 0][None], mask_s, torch.eye(3)[None], mask_v)
    sim.sum().backward()
    # matching (0,0)+(1,1) = 1.6 beats (0,1)+(1,0) = 0.9 and others; mean over k=2
    expected = torch.zeros(2, 3)
    expected[0, 0] = expected[1, 1] = 0.5
    assert torch.allclose(M.grad[0, 0], expected)


def test_ap_on_a_diverged_model_is_nan_and_never_hands_the_solver_a_nan():
    """NaN features (a corrupt shard): the loss must come out NaN so the loop stops, not crash."""
    s = torch.randn(3, 2, 4)
    v = torch.randn(3, 3, 4)
    v[1] = float("nan")
    s_mask = torch.ones(3, 2, dtype=torch.bool)
    v_mask = torch.ones(3, 3, dtype=torch.bool)
    sim = document_similarity("ap", s, s_mask, v, v_mask)
    assert torch.isnan(sim[:, 1]).all()  # every pair with document 1's images
    assert torch.isfinite(sim[:, [0, 2]]).all()


def oracle_loss(D: np.ndarray, margin: float, negatives: str) -> float:
    B = len(D)
    h = lambda p, n: max(0.0, margin - p + n)
    total = 0.0
    for i in range(B):
        a = [h(D[i, i], D[i, j]) for j in range(B) if j != i]
        b = [h(D[i, i], D[j, i]) for j in range(B) if j != i]
        pool = max if negatives == "hard" else (lambda x: sum(x) / len(x))
        total += pool(a) + pool(b)
    return total / B


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 8), st.integers(0, 10_000), st.sampled_from(["hard", "mean"]))
def test_in_batch_loss_matches_definition(B, seed, negatives):
    D = np.random.default_rng(seed).uniform(-2, 2, (B, B))
    got = in_batch_loss(torch.tensor(D), 0.2, negatives).item()
    assert got == pytest.approx(oracle_loss(D, 0.2, negatives), abs=1e-9)


def test_loss_is_zero_when_true_pairs_win_by_the_margin():
    D = torch.full((3, 3), 0.1)
    D.fill_diagonal_(0.31)
    assert in_batch_loss(D, 0.2).item() == 0.0


def test_loss_needs_two_documents():
    with pytest.raises(ValueError):
        in_batch_loss(torch.zeros(1, 1))
