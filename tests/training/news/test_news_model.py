"""The news model's parts against direct computation on small tensors: the VSE / VSE++ / HAL
losses (Liu et al. Eq. 1, 4, 5), the four fusers, the source encoder's masking, random_drop,
fastText's subword n-grams and hash, and the loss through the objective registry."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.document import Document, ImageRecord
from schemas.news import parse_sources, sources_of
from schemas.shards import documents_to_table
from training.config import TrainConfig
from training.data import make_batch
from training.news.losses import hal_loss, news_loss, vse_loss, vsepp_loss
from training.news.model import (
    FNV_OFFSET,
    FNV_PRIME,
    NGRAM_MAX,
    NGRAM_MIN,
    Fuser,
    NewsConfig,
    NewsRetrieval,
    SourceEncoder,
    ngram_buckets,
    sentence_slots,
)
from training.news.objective import random_drop
from training.objectives.registry import get_objective, objective_loss
from training.text import Vocabulary


def fnv1a(text: str) -> int:
    """32-bit FNV-1a over the code points of ``text`` (fastText's n-gram hash, which runs over
    UTF-8 bytes: the same number for ASCII)."""
    h = FNV_OFFSET
    for c in text:
        h = ((h ^ ord(c)) * FNV_PRIME) & 0xFFFFFFFF
    return h


def char_ngrams(word: str, nmin: int = NGRAM_MIN, nmax: int = NGRAM_MAX) -> list[str]:
    """fastText's subwords of ``word``: the n-grams of ``<word>``, n in [nmin, nmax]."""
    w = f"<{word}>"
    return [w[i : i + n] for n in range(nmin, nmax + 1) for i in range(len(w) - n + 1)]


def ngram_buckets_loop(words: list[str], buckets: int) -> np.ndarray:
    """``ngram_buckets`` word by word in pure Python (the code before issue #36; the oracle)."""
    rows = [[1 + fnv1a(g) % buckets for g in char_ngrams(w)] for w in words]
    out = np.zeros((len(words), max((len(r) for r in rows), default=0) or 1), dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


sims = st.integers(2, 5).flatmap(
    lambda b: st.lists(st.floats(-1, 1), min_size=b * b, max_size=b * b).map(
        lambda xs: torch.tensor(xs, dtype=torch.float64).reshape(b, b)
    )
)


def _vse_direct(S, m, hardest=False):
    B = len(S)
    total = 0.0
    for i in range(B):
        a = [max(0.0, m - S[i, i] + S[i, j]) for j in range(B) if j != i]
        b = [max(0.0, m - S[i, i] + S[j, i]) for j in range(B) if j != i]
        total += (max(a) + max(b)) if hardest else (sum(a) + sum(b))
    return total / B


def _hal_direct(S, a=20.0, b=30.0, e=0.2):
    B = len(S)
    total = 0.0
    for i in range(B):
        t = sum(math.exp(a * (S[m, i] - e)) for m in range(B) if m != i)
        v = sum(math.exp(a * (S[i, n] - e)) for n in range(B) if n != i)
        total += math.log(1 + t) / a + math.log(1 + v) / a - math.log(1 + b * max(S[i, i], -1 / b + 1e-4))
    return total / B


@settings(max_examples=25, deadline=None)
@given(sims, st.floats(0, 0.5))
def test_vse_and_vsepp_match_the_sums_over_negatives(S, margin):
    Sl = S.numpy()
    assert float(vse_loss(S, margin)) == pytest.approx(_vse_direct(Sl, margin), abs=1e-9)
    assert float(vsepp_loss(S, margin)) == pytest.approx(_vse_direct(Sl, margin, True), abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(sims)
def test_hal_matches_equation_5(S):
    assert float(hal_loss(S)) == pytest.approx(_hal_direct(S.numpy()), rel=1e-9, abs=1e-9)


def test_losses_refuse_a_batch_of_one_and_unknown_names():
    with pytest.raises(ValueError, match="at least 2"):
        news_loss("vse", torch.ones(1, 1))
    with pytest.raises(ValueError, match="unknown loss"):
        news_loss("nce", torch.eye(2))


def test_vse_prefers_aligned_pairs():
    assert float(vse_loss(torch.eye(4))) == 0.0
    assert float(vse_loss(torch.ones(4, 4))) > 0.0


def _x_mask(seed=0, B=5, S=4, d=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, d, generator=g)
    mask = torch.rand(B, S, generator=g) < 0.6
    mask[:, 0] |= ~mask.any(1)  # at least one present source per row
    return x, mask


def test_max_and_add_fusers_are_the_masked_max_and_sum():
    x, mask = _x_mask()
    got_max, got_add = Fuser("max", 4, 3)(x, mask), Fuser("add", 4, 3)(x, mask)
    for b in range(x.shape[0]):
        rows = x[b][mask[b]]
        assert torch.allclose(got_max[b], rows.max(0).values)
        assert torch.allclose(got_add[b], rows.sum(0))


def test_attention_fuser_is_self_attention_then_two_linear_layers():
    torch.manual_seed(0)
    fuser = Fuser("attention", 4, 3).eval()
    x, mask = _x_mask(1)
    got = fuser(x, mask)
    W, bias = fuser.attn.in_proj_weight, fuser.attn.in_proj_bias
    for b in range(x.shape[0]):
        xb = x[b] * mask[b][:, None]
        q, k, v = (xb @ W[i * 3 : (i + 1) * 3].T + bias[i * 3 : (i + 1) * 3] for i in range(3))
        scores = (q @ k.T / math.sqrt(3)).masked_fill(~mask[b][None, :], float("-inf"))
        a = fuser.attn.out_proj(scores.softmax(-1) @ v) * mask[b][:, None]
        want = fuser.net(a.flatten())
        assert torch.allclose(got[b], want, atol=1e-5)


@pytest.mark.parametrize("kind", ["max", "add", "mlp", "attention"])
def test_a_masked_source_does_not_matter(kind):
    torch.manual_seed(0)
    fuser = Fuser(kind, 4, 3).eval()
    x, mask = _x_mask(2)
    y = x.clone()
    y[~mask] = 99.0  # whatever a missing source's slot holds
    assert torch.allclose(fuser(x, mask), fuser(y, mask), atol=1e-6)


def test_source_encoder_ignores_padding():
    torch.manual_seed(0)
    cfg = NewsConfig(vocab_size=10, word_dim=4, d=5, d_hidden=6, heads=2)
    enc = SourceEncoder(cfg).eval()
    e = torch.randn(1, 3, 4)
    short = enc(e, torch.ones(1, 3, dtype=torch.bool))
    padded = enc(torch.cat([e, torch.randn(1, 2, 4)], 1), torch.tensor([[True] * 3 + [False] * 2]))
    assert torch.allclose(short, padded, atol=1e-6)


def test_text_vectors_do_not_depend_on_the_batchs_padding():
    """encode_text cuts each source's rows to that source's longest sentence: a sample's vector
    is the same alone, in a batch, and with extra padding columns (the brute-force oracle)."""
    g = torch.Generator().manual_seed(0)
    words = ["<pad>", "<unk>", *(f"w{i}" for i in range(18))]
    torch.manual_seed(0)
    cfg = NewsConfig(vocab_size=20, word_dim=8, d=8, d_hidden=8, subword_buckets=16, words=words)
    model = NewsRetrieval(cfg).eval()
    # 3 samples, 8 sentences of 1..9 words: sample b's sources are slots[rows == b]
    slots = torch.tensor([0, 1, 2, 3, 0, 2, 1, 3])
    rows = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    lengths = torch.tensor([2, 5, 9, 1, 3, 7, 4, 2])
    tokens = torch.randint(2, 20, (8, 9), generator=g) * (torch.arange(9)[None, :] < lengths[:, None])
    keep = torch.ones(3, 4, dtype=torch.bool)
    with torch.no_grad():
        text = model.encode_text(tokens, lengths, slots, rows, keep)
        wide = torch.cat([tokens, torch.zeros(8, 7, dtype=torch.long)], 1)
        assert torch.allclose(model.encode_text(wide, lengths, slots, rows, keep), text, atol=1e-6)
        for b in range(3):
            own = rows == b
            t = int(lengths[own].max())
            alone = model.encode_text(tokens[own][:, :t], lengths[own], slots[own], rows[own] * 0, keep[:1])
            assert torch.allclose(alone[0], text[b], atol=1e-6)


def test_a_chain_vector_does_not_depend_on_the_longer_rows_of_its_batch():
    """CHAIN (characters): each row encoded alone equals the row in a batch with longer rows
    (the padding after a row's characters must read as the row's own zero padding)."""
    from training.news.chain import CharConvEncoder

    torch.manual_seed(0)
    words = ["<pad>", "<unk>", "a", "bb", "ccc", "dddd", "eeeee"]
    enc = CharConvEncoder(d=8, d_hidden=8, words=words).eval()
    tokens = torch.tensor([[2, 0, 0, 0], [3, 4, 5, 6], [6, 6, 0, 0], [0, 0, 0, 0]])
    with torch.no_grad():
        batch = enc(tokens)
        for i in range(len(tokens)):
            assert torch.allclose(enc(tokens[i : i + 1]), batch[i : i + 1], atol=1e-6), i


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 0.9))
def test_random_drop_keeps_one_present_source_and_never_invents_one(seed, p):
    g = torch.Generator().manual_seed(seed)
    present = torch.rand(16, 4, generator=g) < 0.7
    present[:, 2] |= ~present.any(1)
    keep = random_drop(present, p, g)
    assert not (keep & ~present).any()
    assert keep.any(1).all()


def test_random_drop_drops_at_rate_p():
    present = torch.ones(4000, 4, dtype=torch.bool)
    keep = random_drop(present, 0.3, torch.Generator().manual_seed(0))
    # one source always kept, each of the other three kept with 0.7: 1 + 3 * 0.7 = 3.1 per row
    assert float(keep.sum(1).float().mean()) == pytest.approx(3.1, abs=0.05)
    assert torch.equal(random_drop(present, 0.0), present)


def test_fasttext_subwords_and_hash():
    assert char_ngrams("where", 3, 3) == ["<wh", "whe", "her", "ere", "re>"]  # fastText's example
    assert len(char_ngrams("ab")) == 2 + 1  # <ab, ab>, <ab>
    assert fnv1a("") == 2166136261 and fnv1a("a") == 0xE40C292C  # FNV-1a 32 test vectors
    table = ngram_buckets(["kreis", "ab"], 10)
    assert (table[0] > 0).sum() == len(char_ngrams("kreis")) and (table[1] > 0).sum() == 3
    assert char_ngrams("ab") == ["<ab", "ab>", "<ab>"] and len(char_ngrams("where")) == 5 + 4 + 3


def test_news_source_names():
    assert parse_sources("caption, headline") == ("headline", "caption")
    assert sources_of({"news_sources": "lead,body"}) == ["lead", "body"]
    for bad in ("", "title", "body,body"):
        with pytest.raises(ValueError):
            parse_sources(bad)
    with pytest.raises(ValueError, match="in order"):
        sources_of({"news_sources": "body,lead"})


def news_docs(n: int) -> list[Document]:
    rng = np.random.default_rng(0)
    words = ["red", "blue", "kreis", "stern", "city", "photo", "big", "klein"]
    docs = []
    for i in range(n):
        names = ["headline", "body", "caption"] if i % 2 else ["headline", "lead", "body", "caption"]
        docs.append(
            Document(
                doc_id=f"a{i:03d}#0",
                source="news-jsonl",
                split="train",
                sentences=[" ".join(rng.choice(words, 3)) for _ in names],
                images=[
                    ImageRecord(f"c{i}", f"u{i}", 8, 8, i, rng.normal(size=6).astype(np.float32).tolist())
                ],
                links=[(j, 0) for j in range(len(names))],
                metadata={"news_sources": ",".join(names), "language": "en", "date": "2020-01-01"},
            )
        )
    return docs


def _batch(n=8):
    table = documents_to_table(news_docs(n))
    vocab = Vocabulary.build([s for d in table.column("sentences").to_pylist() for s in d], 1)
    return make_batch(table, vocab, 10), vocab


def test_sentence_slots_follow_the_metadata():
    batch, _ = _batch(2)
    slots, rows = sentence_slots(batch.metadata, batch.n_sentences, ("lead", "caption"))
    assert slots.tolist() == [-1, 0, -1, 1, -1, -1, 1] and rows.tolist() == [0, 0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="source names"):
        sentence_slots(batch.metadata, [1, 3], ("lead",))


@pytest.mark.parametrize("fusion", ["max", "attention"])
def test_news_loss_through_the_registry(fusion):
    batch, vocab = _batch()
    torch.manual_seed(0)
    model = NewsRetrieval(
        NewsConfig(
            vocab_size=len(vocab),
            word_dim=8,
            image_dim=6,
            d=8,
            d_hidden=8,
            fusion=fusion,
            subword_buckets=20,
            words=vocab.words,
        )
    )
    assert get_objective("news").family == "retrieval" and not get_objective("news").link_metrics
    cfg = TrainConfig(objective="news", fusion=fusion, random_drop=0.3, news_loss="vse")
    model.eval()
    s, v = model(batch)
    want = vse_loss(s @ v.T, cfg.margin)
    loss, parts = objective_loss(model, batch, cfg)  # eval: complete inputs, no drop
    assert float(loss) == pytest.approx(float(want)) and parts == {"ret": pytest.approx(float(want))}
    model.train()
    loss, _ = objective_loss(model, batch, cfg, torch.Generator().manual_seed(1))
    loss.backward()
    assert model.embed.ngrams.weight.grad.abs().sum() > 0


def test_a_sample_without_the_models_source_scores_zero():
    batch, vocab = _batch(4)
    model = NewsRetrieval(
        NewsConfig(vocab_size=len(vocab), word_dim=8, image_dim=6, d=8, sources=("lead",))
    ).eval()
    s, _ = model(batch)
    assert s[1].abs().sum() == 0 and s[3].abs().sum() == 0  # odd samples have no lead
    assert torch.allclose(s[0].norm(), torch.tensor(1.0))


def test_news_config_rules():
    cfg = TrainConfig(objective="news", news_sources="caption")
    assert cfg.model_backbone == "news" and cfg.select_by == "val_medr" and cfg.label == "news-caption-vse"
    with pytest.raises(Exception, match="random_drop"):
        TrainConfig(objective="news", news_sources="caption", random_drop=0.3)
    with pytest.raises(Exception, match="news_sources"):
        TrainConfig(objective="news", news_sources="title")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=14), max_size=12), st.integers(1, 5000))
def test_vectorised_ngram_hashing_equals_the_word_by_word_loop(words, buckets):
    """Issue #36: the vectorised hash gives every word the buckets of its pure-Python n-grams,
    in order, for any text (non-ASCII, empty, one character)."""
    assert np.array_equal(ngram_buckets(words, buckets), ngram_buckets_loop(words, buckets))


def test_subword_embedding_averages_word_and_ngrams_and_reaches_unseen_words():
    """Liu et al. Sect. 4.3.1: a vocabulary word is the mean of its word vector and its n-gram
    vectors; a word outside the vocabulary the mean of its n-gram vectors (not <unk>'s); both
    times sqrt(count) (WordEmbedding's doc)."""
    words = ["<pad>", "<unk>", "velmorra"]
    torch.manual_seed(0)
    cfg = NewsConfig(vocab_size=3, word_dim=4, d=4, d_hidden=4, subword_buckets=50, words=words)
    net = NewsRetrieval(cfg)
    tokens, lengths, ngrams = net.tokenize(["velmorra velmorran"], ["headline"])
    assert tokens.tolist() == [[2, 1]] and lengths.tolist() == [2]
    e = net.embed(tokens, ngrams)[0]
    table = net.embed.ngrams.weight
    known = torch.as_tensor(ngram_buckets(["velmorra"], 50)[0])
    unseen = torch.as_tensor(ngram_buckets(["velmorran"], 50)[0])
    want_known = (net.embed.words.weight[2] + table[known].sum(0)) / (1 + len(known)) ** 0.5
    assert torch.allclose(e[0], want_known, atol=1e-6)
    assert torch.allclose(e[1], table[unseen].mean(0) * len(unseen) ** 0.5, atol=1e-6)
    off = NewsRetrieval(NewsConfig(vocab_size=3, word_dim=4, d=4, d_hidden=4, words=words))
    t, _, g = off.tokenize(["velmorran"], ["headline"])
    assert g is None and torch.equal(off.embed(t, g)[0, 0], off.embed.words.weight[1])  # <unk>


@pytest.mark.parametrize("pooling", ["sum-sqrt", "mean"])
def test_subword_pooling_is_what_the_help_says(pooling):
    """Issue #46: ``--subword-pooling`` names how a word's vector and its n-gram vectors pool, its
    help says it (sum-sqrt: the sum / sqrt(count), the default; mean: the plain mean), the model
    computes it, and ``--subword-buckets``' help no longer calls the default an average."""
    import dataclasses

    from schemas.config_fields import field_info

    helps = {f.name: field_info(f).help for f in dataclasses.fields(TrainConfig) if field_info(f)}
    assert TrainConfig().subword_pooling == "sum-sqrt" and "sum / sqrt(count)" in helps["subword_pooling"]
    assert "mean = their plain average" in helps["subword_pooling"]
    assert "averaged" not in helps["subword_buckets"] and "--subword-pooling" in helps["subword_buckets"]
    words = ["<pad>", "<unk>", "velmorra"]
    torch.manual_seed(0)
    cfg = NewsConfig(
        vocab_size=3, word_dim=4, d=4, d_hidden=4, subword_buckets=50, words=words, subword_pooling=pooling
    )
    net = NewsRetrieval(cfg)
    tokens, _, ngrams = net.tokenize(["velmorra velmorran"], ["headline"])
    e = net.embed(tokens, ngrams)[0]
    table = net.embed.ngrams.weight
    known = torch.as_tensor(ngram_buckets(["velmorra"], 50)[0])
    vectors = torch.cat([net.embed.words.weight[2:3], table[known]])
    n = len(vectors)
    want = vectors.sum(0) / (n**0.5 if pooling == "sum-sqrt" else n)
    assert torch.allclose(e[0], want, atol=1e-6)
    # a model config saved before the field (no subword_pooling) pools as it was trained: sum-sqrt
    old = {k: v for k, v in cfg.to_dict().items() if k != "subword_pooling"}
    assert NewsConfig(**old).subword_pooling == "sum-sqrt"
    with pytest.raises(ValueError, match="subword pooling"):
        NewsConfig(**{**old, "subword_pooling": "max"})


def test_each_source_keeps_its_own_number_of_tokens():
    words = ["<pad>", "<unk>", "a", "b"]
    net = NewsRetrieval(
        NewsConfig(
            vocab_size=4, word_dim=4, d=4, d_hidden=4, words=words, max_tokens={"headline": 2, "body": 5}
        )
    )
    text = "a b a b a b a b"
    _, lengths, _ = net.tokenize([text, text, text, ""], ["headline", "body", "lead", "body"])
    assert lengths.tolist() == [2, 5, 8, 1]  # lead: no limit in this config; "" -> one <unk>


def test_texts_cut_by_the_per_source_limits_are_counted_and_named():
    from training.news.objective import count_cuts, token_limits, truncation_warning

    limits = token_limits(TrainConfig(objective="news", news_max_tokens="headline=2,body=4"))
    assert limits["headline"] == 2 and limits["body"] == 4 and limits["caption"] == 60  # defaults kept
    docs = [["a b c", "a b c d"], ["a b", "a b c d e"], ["x"]]
    meta = [{"news_sources": "headline,body"}, {"news_sources": "headline,body"}, {"news_sources": "caption"}]
    cut = count_cuts(docs, meta, limits)
    assert cut["headline"] == [1, 2] and cut["body"] == [1, 2] and cut["caption"] == [0, 1]
    assert truncation_warning(cut) == (
        "news text cut to --news-max-tokens in training: 1 of 2 headline texts, 1 of 2 body texts"
    )
    assert truncation_warning({"body": [0, 5]}) is None
    with pytest.raises(Exception, match="news_max_tokens"):
        TrainConfig(objective="news", news_max_tokens="title=3")
