"""Li et al. 2021 objectives against an independent per-document, per-pair NumPy computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.data import pad_documents
from training.link.li2021 import li2021_loss, sub_document_masks
from training.link.loss import in_batch_loss
from training.link.similarity import document_similarity

# ---------------------------------------------------------------- brute force (NumPy, float64)


def tk_np(M: np.ndarray) -> float:
    """TK with k = min(n, m): mean of the k largest row maxima + of the k largest column maxima."""
    k = min(M.shape)
    rows = np.sort(M.max(1))[::-1][:k].mean()
    cols = np.sort(M.max(0))[::-1][:k].mean()
    return float(rows + cols)


def negtk_np(M: np.ndarray) -> float:
    """The k smallest row minima and column minima, written out directly (not via -TK(-M))."""
    k = min(M.shape)
    return float(np.sort(M.min(1))[:k].mean() + np.sort(M.min(0))[:k].mean())


def hinge_np(pos: float, neg: float, margin: float) -> float:
    return max(0.0, margin - pos + neg)


def cross_np(S: list, V: list, pos: list[float], margin: float, negatives: str) -> float:
    """Eq. 1 / Eq. 4: document i's positive ``pos[i]`` against sim(S_i, V_j) and sim(S_j, V_i)."""
    B, total = len(S), 0.0
    for i in range(B):
        wrong_images = [hinge_np(pos[i], tk_np(S[i] @ V[j].T), margin) for j in range(B) if j != i]
        wrong_texts = [hinge_np(pos[i], tk_np(S[j] @ V[i].T), margin) for j in range(B) if j != i]
        pool = max if negatives == "hard" else (lambda xs: sum(xs) / len(xs))
        total += pool(wrong_images) + pool(wrong_texts)
    return total / B


def brute_force(S, V, margin, negatives, keep_s=None, keep_v=None) -> dict[str, float]:
    own = [tk_np(S[i] @ V[i].T) for i in range(len(S))]
    out = {
        "C": cross_np(S, V, own, margin, negatives),
        "I": float(np.mean([hinge_np(own[i], negtk_np(S[i] @ V[i].T), margin / 2) for i in range(len(S))])),
    }
    if keep_s is not None:
        sub = [tk_np(S[i][keep_s[i]] @ V[i][keep_v[i]].T) for i in range(len(S))]
        out["D"] = cross_np(S, V, sub, margin / 2, negatives)
    return out


# ---------------------------------------------------------------- helpers


def random_docs(sizes: list[tuple[int, int]], d: int, seed: int):
    rng = np.random.default_rng(seed)
    unit = lambda n: (x := rng.normal(size=(n, d))) / np.linalg.norm(x, axis=1, keepdims=True)
    return [unit(n) for n, _ in sizes], [unit(m) for _, m in sizes]


def padded(S, V, requires_grad: bool = False):
    s = torch.tensor(np.concatenate(S), dtype=torch.float64, requires_grad=requires_grad)
    v = torch.tensor(np.concatenate(V), dtype=torch.float64, requires_grad=requires_grad)
    s_pad, s_mask = pad_documents(s, [len(x) for x in S])
    v_pad, v_mask = pad_documents(v, [len(x) for x in V])
    return s, v, s_pad, s_mask, v_pad, v_mask


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


sizes_st = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=2, max_size=5)


# ---------------------------------------------------------------- tests


@settings(max_examples=60, deadline=None)
@given(
    sizes=sizes_st,
    seed=st.integers(0, 2**16),
    negatives=st.sampled_from(["hard", "mean"]),
    fraction=st.sampled_from([0.5, 0.6, 0.8, 1.0]),
)
def test_parts_match_brute_force(sizes, seed, negatives, fraction):
    S, V = random_docs(sizes, d=4, seed=seed)
    _, _, s_pad, s_mask, v_pad, v_mask = padded(S, V)
    keep_s, keep_v = sub_document_masks(s_mask, v_mask, fraction, gen(seed))
    keep_s = [keep_s[i, : len(S[i])].numpy() for i in range(len(S))]
    keep_v = [keep_v[i, : len(V[i])].numpy() for i in range(len(V))]
    expected = brute_force(S, V, 0.2, negatives, keep_s, keep_v)
    total, parts = li2021_loss(
        s_pad, s_mask, v_pad, v_mask, ("C", "I", "D"), 0.2, negatives, fraction, gen(seed)
    )
    for p in ("C", "I", "D"):
        assert parts[p] == pytest.approx(expected[p], abs=1e-9), p
    assert float(total) == pytest.approx(sum(expected.values()), abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(sizes=sizes_st, seed=st.integers(0, 2**16), fraction=st.floats(0.05, 1.0))
def test_sub_document_sizes_and_subsets(sizes, seed, fraction):
    S, V = random_docs(sizes, d=2, seed=seed)
    _, _, _, s_mask, _, v_mask = padded(S, V)
    keep_s, keep_v = sub_document_masks(s_mask, v_mask, fraction, gen(seed))
    for keep, mask, docs in ((keep_s, s_mask, S), (keep_v, v_mask, V)):
        assert not (keep & ~mask).any()  # never a padded slot
        for i, x in enumerate(docs):
            want = max(1, math.floor(round(fraction * len(x), 6)))
            assert int(keep[i].sum()) == want


def test_sub_document_floor_is_the_decimal_one():
    mask = torch.ones(1, 100, dtype=torch.bool)
    keep, _ = sub_document_masks(mask, mask, 0.29, gen(0))
    assert int(keep.sum()) == 29  # 0.29 * 100 == 28.999999999999996 in floating point
    keep, _ = sub_document_masks(torch.ones(1, 5, dtype=torch.bool), mask, 0.6, gen(0))
    assert int(keep.sum()) == 3  # the paper's DII/SIS setting on 5-sentence documents


def test_sub_documents_are_uniform_and_seeded():
    mask = torch.ones(2000, 5, dtype=torch.bool)
    keep, _ = sub_document_masks(mask, mask, 0.6, gen(1))
    freq = keep.double().mean(0)  # each of the 5 slots kept with probability 3/5
    assert torch.allclose(freq, torch.full((5,), 0.6, dtype=torch.float64), atol=0.04)
    again, _ = sub_document_masks(mask, mask, 0.6, gen(1))
    assert torch.equal(keep, again)
    other, _ = sub_document_masks(mask, mask, 0.6, gen(2))
    assert not torch.equal(keep, other)


@pytest.mark.parametrize("parts", [("C",), ("C", "I"), ("C", "D"), ("C", "I", "D"), ("I", "D")])
def test_combinations_sum_their_parts(parts):
    S, V = random_docs([(5, 5), (3, 4), (1, 6), (6, 1), (2, 2)], d=8, seed=5)
    _, _, s_pad, s_mask, v_pad, v_mask = padded(S, V)
    total, logged = li2021_loss(s_pad, s_mask, v_pad, v_mask, parts, 0.2, "hard", 0.6, gen(3))
    assert set(logged) == set(parts)
    alone = {
        p: float(li2021_loss(s_pad, s_mask, v_pad, v_mask, (p,), 0.2, "hard", 0.6, gen(3))[0]) for p in parts
    }
    assert float(total) == pytest.approx(sum(alone.values()), abs=1e-12)
    assert logged == pytest.approx(alone, abs=1e-12)


def test_cross_part_is_the_tk_in_batch_loss():
    S, V = random_docs([(4, 3), (2, 5), (6, 6)], d=8, seed=2)
    _, _, s_pad, s_mask, v_pad, v_mask = padded(S, V)
    for negatives in ("hard", "mean"):
        loss, _ = li2021_loss(s_pad, s_mask, v_pad, v_mask, ("C",), 0.2, negatives)
        sims = document_similarity("tk", s_pad, s_mask, v_pad, v_mask, "full")
        assert float(loss) == pytest.approx(float(in_batch_loss(sims, 0.2, negatives)), abs=1e-12)


def test_deterministic_given_a_generator_and_only_d_draws():
    S, V = random_docs([(5, 5), (4, 2), (3, 6)], d=8, seed=9)
    _, _, s_pad, s_mask, v_pad, v_mask = padded(S, V)
    a = li2021_loss(s_pad, s_mask, v_pad, v_mask, ("C", "I", "D"), 0.2, "hard", 0.6, gen(7))
    b = li2021_loss(s_pad, s_mask, v_pad, v_mask, ("C", "I", "D"), 0.2, "hard", 0.6, gen(7))
    assert a[1] == b[1]
    g = gen(7)
    li2021_loss(s_pad, s_mask, v_pad, v_mask, ("C", "I"), 0.2, "hard", 0.6, g)
    assert torch.equal(g.get_state(), gen(7).get_state())  # no draw without D


def test_one_by_one_documents_have_a_constant_intra_term():
    """n = m = 1: TK = NegTK = 2 M, so the intra hinge is margin/2 with no gradient."""
    S, V = random_docs([(1, 1), (1, 1), (1, 1)], d=4, seed=0)
    s, v, s_pad, s_mask, v_pad, v_mask = padded(S, V, requires_grad=True)
    total, parts = li2021_loss(s_pad, s_mask, v_pad, v_mask, ("I",), 0.2)
    assert parts["I"] == pytest.approx(0.1)
    total.backward()
    assert float(s.grad.abs().sum()) == 0 and float(v.grad.abs().sum()) == 0


@settings(max_examples=30, deadline=None)
@given(sizes=sizes_st, seed=st.integers(0, 2**16), negatives=st.sampled_from(["hard", "mean"]))
def test_gradients_are_finite(sizes, seed, negatives):
    S, V = random_docs(sizes, d=4, seed=seed)
    s, v, s_pad, s_mask, v_pad, v_mask = padded(S, V, requires_grad=True)
    total, _ = li2021_loss(s_pad, s_mask, v_pad, v_mask, ("C", "I", "D"), 0.2, negatives, 0.6, gen(seed))
    total.backward()
    assert torch.isfinite(s.grad).all() and torch.isfinite(v.grad).all()


def test_unknown_parts_are_refused():
    S, V = random_docs([(2, 2), (2, 2)], d=4, seed=0)
    _, _, s_pad, s_mask, v_pad, v_mask = padded(S, V)
    with pytest.raises(ValueError, match="parts"):
        li2021_loss(s_pad, s_mask, v_pad, v_mask, ("C", "X"))
