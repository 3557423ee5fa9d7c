"""Table 1's external baselines (issue #18): ORDER (Vendrov et al.'s order embeddings, checked
against the order-violation formula and VSE's hinges computed directly, and the score every
ranking path uses: test metrics, the report's ranking, the archive search of the served model)
and CHAIN (Wehrmann & Barros' character-level encoder: the character sequences it reads, its
padding invariance, its gradients through the objective)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archive.index import ArchiveIndex
from models.news_serving import archive_search
from training.config import TrainConfig
from training.news.chain import SPACE, UNKNOWN, CharConvEncoder, char_id, char_sequences, char_table
from training.news.losses import EMPTY_ORDER_SCORE, news_loss, order_scores
from training.news.model import NewsConfig, NewsRetrieval
from training.objectives.registry import objective_loss
from training.ranking import retrieval_metrics
from training.retrieval.objective import evaluate_pairs
from training.retrieval.pairs import ranking_scores

from .test_news_model import _batch, _vse_direct

pairs = st.integers(2, 5).flatmap(
    lambda b: st.tuples(
        *(
            st.lists(st.floats(0, 1), min_size=b * 3, max_size=b * 3).map(
                lambda xs, b=b: torch.tensor(xs, dtype=torch.float64).reshape(b, 3)
            )
            for _ in range(2)
        )
    )
)


def _order_direct(t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """-E(image, text) = -sum_k max(0, text_k - image_k)^2 for every (text, image)."""
    return np.array([[-sum(max(0.0, a - b) ** 2 for a, b in zip(x, y)) for y in v] for x in t])


@settings(max_examples=25, deadline=None)
@given(pairs, st.floats(0, 0.5))
def test_order_scores_and_loss_match_the_formulas(tv, margin):
    t, v = tv
    t = t + 1e-3  # no zero text row here (that one has its own rule)
    S = order_scores(t, v)
    assert np.allclose(S.numpy(), _order_direct(t.numpy(), v.numpy()), atol=1e-12)
    assert float(news_loss("order", S, margin)) == pytest.approx(_vse_direct(S.numpy(), margin), abs=1e-9)


def test_order_scores_in_chunks_and_a_missing_text_never_matches(monkeypatch):
    g = torch.Generator().manual_seed(0)
    t, v = torch.rand(7, 4, generator=g), torch.rand(5, 4, generator=g)
    whole = order_scores(t, v)
    monkeypatch.setattr("training.news.losses.ORDER_CHUNK", 8)  # 2 text rows per chunk
    assert torch.equal(order_scores(t, v), whole)
    t[2] = 0.0
    S = order_scores(t, v)
    assert (S[2] == EMPTY_ORDER_SCORE).all() and (S[[0, 1, 3]] > EMPTY_ORDER_SCORE).all()


def _model(vocab, **kw) -> NewsRetrieval:
    torch.manual_seed(0)
    cfg = NewsConfig(vocab_size=len(vocab), word_dim=8, image_dim=6, d=8, d_hidden=8, words=vocab.words, **kw)
    return NewsRetrieval(cfg)


def test_an_order_model_trains_and_ranks_by_the_order_violation():
    batch, vocab = _batch()
    net = _model(vocab, score="order").eval()
    with torch.no_grad():
        s, v = net(batch)
    assert (s >= 0).all() and (v >= 0).all()
    assert torch.allclose(s.norm(dim=1), torch.ones(len(s))) and torch.allclose(
        v.norm(dim=1), torch.ones(len(v))
    )
    S = order_scores(s, v)
    assert torch.equal(net.score(s, v), S) and not torch.allclose(S, s @ v.T)
    cfg = TrainConfig(objective="news", news_loss="order", margin=0.05)
    loss, _ = objective_loss(net, batch, cfg)
    assert float(loss) == pytest.approx(_vse_direct(S.double().numpy(), 0.05), rel=1e-5)
    # every ranking path scores with it: test metrics, the report's / served ranking
    assert torch.equal(ranking_scores(net, s, v, 0.0, 0.1), S)
    test = evaluate_pairs(net, [batch], TrainConfig(objective="news", pool_size=4, n_pools=3), [])
    want = retrieval_metrics(S.numpy(), pool_size=4, n_pools=3, seed=0)
    assert test["t2i"] == want["t2i"] and test["i2t"] == want["i2t"]


def test_the_served_order_model_scans_the_archive_exactly():
    _, vocab = _batch()
    g = torch.Generator().manual_seed(1)
    images = torch.rand(9, 8, generator=g)
    images = images / images.norm(dim=1, keepdim=True)
    archive = ArchiveIndex.build([f"c{i}" for i in range(9)], images.numpy())
    q = torch.rand(3, 8, generator=g)
    order = _model(vocab, score="order")
    scores, rows = archive_search(order, archive, q.numpy(), 4)
    S = order_scores(q, images)
    best = torch.sort(-S, dim=1, stable=True).indices[:, :4]
    assert rows == best.tolist()
    assert np.allclose(scores, S.gather(1, best).numpy())
    _, cosine_rows = archive_search(_model(vocab), archive, q.numpy(), 4)
    assert [[archive.ids[r] for r in row] for row in cosine_rows] == archive.search(q.numpy(), 4)[1]


def test_chain_reads_the_characters_of_the_words():
    words = ["<pad>", "<unk>", "ab", "c"]
    table = torch.from_numpy(char_table(words))
    assert table[0].sum() == 0 and table[1, :2].tolist() == [UNKNOWN, SPACE]
    tokens = torch.tensor([[2, 3, 0, 0], [3, 1, 2, 0]])
    chars, mask = char_sequences(table, tokens)
    a, b, c = char_id("a"), char_id("b"), char_id("c")
    assert chars[0, :5].tolist() == [a, b, SPACE, c, SPACE] and mask[0].sum() == 5
    assert chars[1, :7].tolist() == [c, SPACE, UNKNOWN, SPACE, a, b, SPACE] and mask[1].all()
    enc = CharConvEncoder(d=8, d_hidden=12, words=words).eval()
    out = enc(tokens)
    padded = torch.cat([tokens, torch.zeros(2, 3, dtype=torch.long)], 1)
    assert out.shape == (2, 8) and torch.allclose(enc(padded), out, atol=1e-6)


def test_a_chain_model_has_no_word_embedding_and_trains_through_the_objective():
    batch, vocab = _batch()
    net = _model(vocab, encoder="chain").train()
    assert net.embed is None and not any(n.startswith("embed.") for n in net.state_dict())
    cfg = TrainConfig(objective="news", news_encoder="chain", random_drop=0.3)
    assert cfg.label == "news-headline+lead+body+caption-attention-drop0.3-vse-chain"
    loss, _ = objective_loss(net, batch, cfg, torch.Generator().manual_seed(0))
    loss.backward()
    assert net.encoders["caption"].chars.weight.grad.abs().sum() > 0
    for bad, field in (
        ({"subword_buckets": 10}, "subword_buckets"),
        ({"multilingual": "all-for-one"}, "chain"),
    ):
        with pytest.raises(Exception, match=field):
            TrainConfig(objective="news", news_encoder="chain", init_from="/x", **bad).validate()
