"""CMCA/CMCM modules, losses and the selective refinement against direct computation on small
tensors (loops over pairs, the paper's equations written out)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from training.retrieval.losses import (
    cmcm_loss,
    coherence_loss,
    confidence,
    hardest_triplet_loss,
    mean_triplet_loss,
    relation_weights,
    selective_refinement,
)
from training.retrieval.model import CoherenceRetrieval, RetrievalConfig


def unit(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)


def direct_triplet(s, v, margin):
    B, total = len(s), 0.0
    cos = lambda a, b: float(a @ b)
    for i in range(B):
        neg_img = max(cos(s[i], v[j]) for j in range(B) if j != i)
        neg_txt = max(cos(s[j], v[i]) for j in range(B) if j != i)
        pos = cos(s[i], v[i])
        total += max(0.0, margin - pos + neg_img) + max(0.0, margin - pos + neg_txt)
    return total / B


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 6), st.integers(1, 5), st.integers(0, 10_000), st.sampled_from([0.0, 0.3, 1.0]))
def test_hardest_triplet_matches_direct_computation(B, d, seed, margin):
    g = torch.Generator().manual_seed(seed)
    s, v = unit(torch.randn(B, d, generator=g)), unit(torch.randn(B, d, generator=g))
    assert float(hardest_triplet_loss(s, v, margin)) == pytest.approx(direct_triplet(s, v, margin), abs=1e-6)


def test_mean_triplet_matches_direct_computation():
    g = torch.Generator().manual_seed(1)
    s, v = unit(torch.randn(4, 3, generator=g)), unit(torch.randn(4, 3, generator=g))
    direct = 0.0
    for i in range(4):
        for j in range(4):
            if j != i:
                direct += max(0.0, 0.3 - float(s[i] @ v[i]) + float(s[i] @ v[j]))
                direct += max(0.0, 0.3 - float(s[i] @ v[i]) + float(s[j] @ v[i]))
    assert float(mean_triplet_loss(s, v, 0.3)) == pytest.approx(direct / (4 * 3), abs=1e-6)


def test_triplet_is_zero_when_pairs_are_separated_by_the_margin():
    s = torch.eye(3)
    assert float(hardest_triplet_loss(s, s.clone(), 0.3)) == 0.0
    with pytest.raises(ValueError):
        hardest_triplet_loss(s[:1], s[:1])


def test_weighted_bce_and_total_match_the_equations():
    labels_train = np.array([[1, 0], [1, 1], [0, 0], [1, 0]])
    w = relation_weights(labels_train)
    assert w.tolist() == pytest.approx([4 / 3, 4.0])
    assert relation_weights(np.array([[0], [0]])).tolist() == [2.0]  # no positive: 1 / M
    logits = torch.tensor([[0.3, -1.0], [2.0, 0.5]])
    y = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    direct = 0.0
    for b in range(2):
        for c in range(2):
            x = 1 / (1 + math.exp(-float(logits[b, c])))
            direct += -w[c] * (float(y[b, c]) * math.log(x) + (1 - float(y[b, c])) * math.log(1 - x))
    wt = torch.tensor(w, dtype=torch.float32)
    assert float(coherence_loss(logits, y, wt)) == pytest.approx(direct / 2, rel=1e-5)
    s, v = unit(torch.randn(2, 3)), unit(torch.randn(2, 3))
    total, parts = cmcm_loss(s, v, logits, y, wt, 0.3, 0.1)
    assert float(total) == pytest.approx(parts["ret"] + 0.1 * parts["cls"], rel=1e-5)
    assert set(cmcm_loss(s, v, None, None, None)[1]) == {"ret"}


def direct_refinement(theta, probs, lam, T):
    Q, N = theta.shape
    out = theta.clone()
    hard = []
    for i in range(Q):
        top = sorted(theta[i].tolist(), reverse=True)
        difficult = top[0] - top[1] < T
        hard.append(difficult)
        if difficult:
            for j in range(N):
                eta = sum(math.exp(lam * abs(float(p) - 0.5)) for p in probs[i, j])
                out[i, j] = theta[i, j] * eta
    return out, hard


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 5), st.integers(2, 5), st.integers(1, 3), st.integers(0, 10_000))
def test_selective_refinement_matches_direct_computation(Q, N, C, seed):
    g = torch.Generator().manual_seed(seed)
    theta = torch.rand(Q, N, generator=g) * 2 - 1
    theta[0, :2] = torch.tensor([0.5, 0.45])  # a difficult query, whatever the draw
    probs = torch.rand(Q, N, C, generator=g)
    refined, difficult = selective_refinement(theta, probs, lam=0.12, threshold=0.1)
    expected, hard = direct_refinement(theta, probs, 0.12, 0.1)
    assert difficult.tolist() == hard
    assert torch.allclose(refined, expected, atol=1e-6)
    assert confidence(torch.full((C,), 0.5), 0.13).item() == pytest.approx(C)


def batch_of(tokens, lengths, features):
    return SimpleNamespace(tokens=tokens, lengths=lengths, features=features)


@pytest.mark.parametrize("pooling", ["attention", "mean", "last", "bag"])
def test_model_shapes_padding_and_pair_logits(pooling):
    torch.manual_seed(0)
    cfg = RetrievalConfig(
        vocab_size=20,
        word_dim=8,
        image_dim=6,
        hidden=5,
        d_shared=7,
        pooling=pooling,
        relations=("a", "b", "c"),
    )
    model = CoherenceRetrieval(cfg).eval()
    tokens = torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0], [8, 0, 0, 0]])
    lengths = torch.tensor([3, 2, 1])
    feats = torch.randn(3, 6)
    s, v, logits = model(batch_of(tokens, lengths, feats))
    assert s.shape == (3, 7) and v.shape == (3, 7) and logits.shape == (3, 3)
    assert torch.allclose(s.norm(dim=-1), torch.ones(3), atol=1e-5)
    # extra padding changes nothing
    s2, _, _ = model(batch_of(torch.cat([tokens, torch.zeros(3, 3, dtype=torch.long)], 1), lengths, feats))
    assert torch.allclose(s, s2, atol=1e-6)
    _, alpha = model.text(tokens, lengths, return_attention=True) if pooling != "last" else (None, None)
    if alpha is not None:
        assert torch.allclose(alpha.sum(-1), torch.ones(3), atol=1e-6)
        assert (alpha[1, 2:] == 0).all()
    # every pair's CAM logits equal the CAM on that pair
    pair = model.cam.pair_logits(s, v)
    for i in range(3):
        for j in range(3):
            assert torch.allclose(pair[i, j], model.cam(s[i : i + 1], v[j : j + 1])[0], atol=1e-6)
    assert model.relation_probs(s, v).shape == (3, 3, 3)


def test_the_bag_pooling_is_the_mean_of_the_word_embeddings_through_one_linear_map():
    """The simplest retrieval model (``--retrieval-pooling bag``): no LSTM; against its formula."""
    torch.manual_seed(0)
    cfg = RetrievalConfig(vocab_size=20, word_dim=8, image_dim=6, hidden=5, d_shared=7, pooling="bag")
    model = CoherenceRetrieval(cfg).eval()
    assert model.text.lstm is None
    tokens, lengths = torch.tensor([[3, 4, 5, 0], [6, 0, 0, 0]]), torch.tensor([3, 1])
    s = model.text(tokens, lengths)
    E, P = model.text.embed.weight, model.text.proj
    want = torch.stack([P(E[[3, 4, 5]].mean(0)), P(E[6])])
    assert torch.allclose(s, torch.nn.functional.normalize(want, dim=-1), atol=1e-6)


def test_cmca_has_no_cam_and_hidden_cam_pairs_agree():
    cmca = CoherenceRetrieval(RetrievalConfig(vocab_size=5, word_dim=4, image_dim=3, hidden=2, d_shared=4))
    b = batch_of(torch.tensor([[1, 2]]).repeat(2, 1), torch.tensor([2, 1]), torch.randn(2, 3))
    assert cmca(b)[2] is None and cmca.relation_probs(*cmca.encode(b)) is None
    cfg = RetrievalConfig(
        vocab_size=5,
        word_dim=4,
        image_dim=3,
        hidden=2,
        d_shared=4,
        relations=("a", "b"),
        relation_weights=(1.0, 2.0),
        cam_hidden=6,
    )
    cmcm = CoherenceRetrieval(cfg).eval()
    s, v, _ = cmcm(b)
    pair = cmcm.cam.pair_logits(s, v)
    assert torch.allclose(pair[0, 1], cmcm.cam(s[:1], v[1:2])[0], atol=1e-6)


def _cfg(**kw) -> RetrievalConfig:
    return RetrievalConfig(
        vocab_size=20, word_dim=8, image_dim=6, hidden=5, d_shared=4, relations=("A", "B"), **kw
    )


def _batch(n: int):
    g = torch.Generator().manual_seed(n)
    return batch_of(
        torch.randint(1, 20, (n, 5), generator=g), torch.full((n,), 5), torch.randn(n, 6, generator=g)
    )


def test_a_stopped_cam_gradient_leaves_the_encoders_to_retrieval():
    """--cam-gradient stopped (issue #45): the coherence loss trains the CAM and nothing of the
    text or image encoders; shared (the paper's) reaches them."""
    for mode, reaches in (("stopped", False), ("shared", True)):
        torch.manual_seed(0)
        net = CoherenceRetrieval(_cfg(cam_gradient=mode))
        _, _, logits = net(_batch(3))
        F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits)).backward()
        encoders = [p.grad for p in [*net.text.parameters(), *net.image.parameters()] if p.requires_grad]
        assert any(g is not None and g.abs().sum() > 0 for g in encoders) == reaches, mode
        assert all(p.grad is not None for p in net.cam.parameters())


def test_image_layers_add_hidden_layers_and_keep_unit_vectors():
    torch.manual_seed(0)
    net = CoherenceRetrieval(_cfg(image_layers=2), feature_stats=(np.zeros(6), np.ones(6)))
    assert sum(isinstance(m, torch.nn.Linear) for m in net.image.hidden) == 2
    _, v, _ = net(_batch(3))
    assert v.shape == (3, 4) and torch.allclose(v.norm(dim=-1), torch.ones(3), atol=1e-5)


def _bank_model(d: int = 4, temperature: float = 0.1) -> CoherenceRetrieval:
    cfg = RetrievalConfig(
        vocab_size=5, word_dim=4, image_dim=3, hidden=2, d_shared=d, bank_temperature=temperature
    )
    return CoherenceRetrieval(cfg).eval()


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 5),
    st.integers(1, 5),
    st.sampled_from([0.05, 0.1, 1.0]),
    st.integers(0, 999),
)
def test_the_query_bank_subtracts_each_images_soft_maximum_over_it(Q, N, S, t, seed):
    """score = cosine - t * log(mean_q exp(cos(q, v) / t)), per image, written out pair by pair."""
    g = torch.Generator().manual_seed(seed)
    bank, v, s = (unit(torch.randn(n, 4, generator=g)) for n in (Q, N, S))
    model = _bank_model(temperature=t)
    assert torch.equal(model.score(s, v), s @ v.T)  # empty bank: the plain cosine
    model.set_query_bank(bank)
    got = model.score(s, v)
    for i in range(S):
        for j in range(N):
            soft = t * math.log(sum(math.exp(float(bank[q] @ v[j]) / t) for q in range(Q)) / Q)
            assert abs(float(got[i, j]) - (float(s[i] @ v[j]) - soft)) < 1e-4


def test_the_query_bank_demotes_an_image_near_every_caption():
    """A hub (an image every caption is near) ranks first for a text it does not answer by the
    cosine, and below that text's own image once the bank is in."""
    model = _bank_model(d=3)
    own, hub = unit(torch.tensor([[1.0, 0.0, 0.0]])), unit(torch.tensor([[0.6, 0.6, 0.5]]))
    text = unit(torch.tensor([[0.8, 0.55, 0.2]]))  # nearer the hub than its own image
    v = torch.cat([own, hub])
    assert model.score(text, v).argmax() == 1
    model.set_query_bank(unit(torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.1, 0.7, 0.7]])))
    assert model.score(text, v).argmax() == 0


def test_the_query_bank_travels_in_the_state_dict_and_old_checkpoints_load():
    model = _bank_model()
    model.set_query_bank(unit(torch.randn(7, 4)))
    fresh = _bank_model()
    fresh.load_state_dict(model.state_dict())  # the bank's size comes from the checkpoint
    assert torch.equal(fresh.query_bank, model.query_bank)
    old = {k: v for k, v in model.state_dict().items() if k != "query_bank"}  # before the bank
    plain = _bank_model()
    plain.load_state_dict(old)
    assert plain.query_bank.shape == (0, 4)
    s, v = unit(torch.randn(2, 4)), unit(torch.randn(3, 4))
    assert torch.equal(plain.score(s, v), s @ v.T)
