"""The served model's fast paths (issue #18's latency work) change no result: a served article's
vector is bit-identical to the batch encoder's (so its top 10 is the same), the lazy tokeniser
gives the same tokens, and a ``pq`` archive keeps the re-rank factor it was saved with.
Tiny random models and archives: no fit, no server."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from archive.index import PQ_REFINE_FACTOR, ArchiveIndex, back_with_huge_pages
from schemas.errors import MmlinksError
from schemas.text import _TOKEN_RE, first_tokens, has_tokens, tokenize
from training.news.encode import encode_article, encode_articles
from training.news.model import NewsConfig, NewsRetrieval
from training.text import Vocabulary

WORDS = [f"w{i}" for i in range(30)]
VOCAB = Vocabulary(["<pad>", "<unk>", *WORDS])
SOURCES = ("headline", "lead", "body", "caption")


def _model(fusion: str, heads: int, subwords: bool, score: str, encoder: str = "attention") -> NewsRetrieval:
    torch.manual_seed(0)
    cfg = NewsConfig(
        vocab_size=len(VOCAB.words),
        word_dim=12,
        image_dim=8,
        d=8,
        d_hidden=16,
        heads=heads,
        fusion=fusion,
        subword_buckets=32 if subwords else 0,
        words=VOCAB.words if subwords or encoder == "chain" else [],
        encoder=encoder,
        score=score,
    )
    return NewsRetrieval(cfg).eval()


_text = st.one_of(
    st.just(""),
    st.just("?!"),  # punctuation only: no words, the source is absent
    st.lists(st.sampled_from([*WORDS, "unknown", "u.s.", "2024"]), min_size=1, max_size=30).map(" ".join),
)
_article = st.fixed_dictionaries({s: _text for s in SOURCES}).filter(
    lambda a: any(has_tokens(a[s]) for s in SOURCES)
)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(_article, min_size=1, max_size=4),
    st.sampled_from(["attention", "max", "add", "mlp"]),
    st.sampled_from([2, 3]),  # 3 heads: nn.MultiheadAttention has no fast path, forward is used
    st.booleans(),
    st.sampled_from(["cosine", "order"]),
)
# sources of different n-gram widths: encoded one by one, the narrower table summed its zero
# padding in another order (2.98e-8 off) until the fast path tokenised them in one call
@example([{"headline": "", "lead": "", "body": "w12", "caption": "unknown"}], "attention", 2, True, "cosine")
def test_a_served_article_is_bit_identical_to_the_batch_encoder(articles, fusion, heads, subwords, score):
    """``encode_article`` (predict's path) against ``encode_articles`` of the article alone,
    the brute-force reference: the same bytes, hence the same top 10 of any archive."""
    net = _model(fusion, heads, subwords, score)
    archive = torch.nn.functional.normalize(
        torch.randn(64, 8, generator=torch.Generator().manual_seed(1)), dim=1
    )
    for a in articles:
        fast = encode_article(net, VOCAB, 20, a)
        ref = encode_articles(net, VOCAB, 20, [a])
        assert torch.equal(fast, ref), (fast - ref).abs().max()
        assert torch.equal(
            net.score(fast, archive).topk(10).indices, net.score(ref, archive).topk(10).indices
        )


def test_a_chain_model_serves_through_the_batch_encoder_with_the_same_vector():
    net = _model("attention", 2, False, "cosine", encoder="chain")
    a = {"headline": "w1 w2 w3", "body": "w4 " * 12, "caption": "w5"}
    assert torch.equal(encode_article(net, VOCAB, 20, a), encode_articles(net, VOCAB, 20, [a]))
    with pytest.raises(ValueError, match="CHAIN"):  # the model itself has no per-source path for it
        net.encode_article({"headline": torch.tensor([[2, 3]])})


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab1 .,!?-'@#:)é\n")), max_size=60), st.integers(0, 12))
def test_the_lazy_tokeniser_gives_the_same_tokens(text, n):
    assert first_tokens(text, n) == tokenize(text)[:n]
    assert has_tokens(text) == any(any(c.isalnum() for c in tok) for tok in _TOKEN_RE.findall(text.lower()))
    assert VOCAB.encode(text, n) == ([VOCAB.index.get(t, 1) for t in tokenize(text)[:n]] or [1])


def _unit(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_pq_archive_keeps_its_refine_factor_and_huge_pages_change_no_result(tmp_path):
    x, q = _unit(1000, 16, 0), _unit(20, 16, 1)
    pq = ArchiveIndex.build([str(i) for i in range(len(x))], x, kind="pq")
    assert pq.refine_factor == PQ_REFINE_FACTOR
    pq.set_refine_factor(20)
    want = pq.search_rows(q, 10)
    folder = pq.save(tmp_path / "pq")
    assert json.loads((folder / "index.json").read_text())["refine_factor"] == 20
    loaded = ArchiveIndex.load(folder, huge_pages=True)  # as the served model loads it
    assert loaded.refine_factor == 20 and "refine_factor" not in loaded.info
    got = loaded.search_rows(q, 10)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]
    assert back_with_huge_pages(loaded.index) >= 0  # again: best effort, no error
    # an index saved before the factor was saved keeps the old default
    meta = json.loads((folder / "index.json").read_text())
    del meta["refine_factor"]
    (folder / "index.json").write_text(json.dumps(meta))
    assert ArchiveIndex.load(folder).refine_factor == PQ_REFINE_FACTOR
    for bad in (0, 1001, 2.5, True):
        with pytest.raises(MmlinksError, match="re-rank factor"):
            pq.set_refine_factor(bad)
    flat = ArchiveIndex.build(["a", "b"], x[:2])
    assert flat.refine_factor is None
    with pytest.raises(MmlinksError, match="pq only"):
        flat.set_refine_factor(10)


def test_predict_answers_an_empty_request_with_an_empty_frame(tmp_path):
    """Zero rows must give zero rows, not a 500 (no encoder runs)."""
    import pandas as pd

    from models.news_serving import NewsModel

    net = _model("attention", 2, False, "cosine")
    model = NewsModel()
    model.model, model.vocab, model.max_tokens, model.threads = net, VOCAB, 20, None
    model.languages = ("en",)
    x = _unit(40, 8, 2)
    model.archive = ArchiveIndex.build([str(i) for i in range(40)], x)
    out = model.predict(None, pd.DataFrame(columns=["language", "headline"]), {"top_k": 3})
    assert list(out.columns) == ["image_ids", "scores", "uris"] and len(out) == 0
    one = model.predict(None, pd.DataFrame([{"language": "en", "headline": "w1 w2"}]), {"top_k": 3})
    q = encode_articles(net, VOCAB, 20, [{"headline": "w1 w2"}]).numpy()[0]
    assert one["image_ids"][0] == [str(i) for i in np.argsort(-(x @ q), kind="stable")[:3]]


def test_a_request_of_several_articles_gives_each_the_top_k_it_gets_alone():
    """Several articles go through the batch encoder (cheaper an article), one through the
    single-article path: each article's top k and scores are the same either way."""
    import pandas as pd

    from models.news_serving import NewsModel

    model = NewsModel()
    model.model, model.vocab, model.max_tokens, model.threads = (
        _model("attention", 2, True, "cosine"),
        VOCAB,
        20,
        None,
    )
    model.languages = ("en",)
    model.archive = ArchiveIndex.build([str(i) for i in range(60)], _unit(60, 8, 4))
    rows = [
        {"language": "en", "headline": "w1 w2 w3", "body": "w4 w5 " * 9},
        {"language": "en", "caption": "w7 unknown"},
        {"language": "en", "lead": "w9 w10 w11 w12", "body": "w13"},
    ]
    batch = model.predict(None, pd.DataFrame(rows), {"top_k": 5})
    assert len(batch) == len(rows)
    for i, row in enumerate(rows):
        alone = model.predict(None, pd.DataFrame([row]), {"top_k": 5})
        assert batch["image_ids"][i] == alone["image_ids"][0]
        np.testing.assert_allclose(batch["scores"][i], alone["scores"][0], rtol=1e-5, atol=1e-6)


def test_the_model_freezes_the_gc_and_warms_up_only_when_mlflow_serves_it(tmp_path, monkeypatch):
    """Under ``mlflow models serve`` (its model-path variable set) loading the model moves what
    is alive to the permanent generation, so no full collection stalls a request, and runs one
    article through the served path; elsewhere (tests, training, Dagster) nothing changes."""
    import gc

    import mlflow
    import pandas as pd

    from models.news_packaging import log_news_model
    from models.news_serving import NewsModel
    from models.news_threads import SCORING_SERVER_ENV
    from tests.training.news.helpers import news_checkpoint, write_news_dataset

    _, docs = write_news_dataset(tmp_path / "data")
    ckpt, vocab = news_checkpoint(tmp_path / "ckpt", docs)
    index = ArchiveIndex.build([str(i) for i in range(40)], _unit(40, 16, 3))
    path = log_news_model(str(ckpt), vocab, index, ["en"], "run-1", tmp_path / "model")
    gc.unfreeze()
    warmed = []
    real_warm_up = NewsModel.warm_up
    monkeypatch.setattr(NewsModel, "warm_up", lambda self: warmed.append(real_warm_up(self)))
    monkeypatch.delenv(SCORING_SERVER_ENV, raising=False)
    plain = mlflow.pyfunc.load_model(path)
    assert gc.get_freeze_count() == 0 and not warmed
    monkeypatch.setenv(SCORING_SERVER_ENV, path)
    try:
        served = mlflow.pyfunc.load_model(path)
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()  # this test process goes on collecting as before
    # served, it also ran one article through encode and search at load (torch's one-off
    # set-up off the first request), and answers as the plain load does
    assert len(warmed) == 1
    article = pd.DataFrame([{"language": "en", "headline": docs[0].sentences[0], "caption": "red dot"}])
    a, b = plain.predict(article, params={"top_k": 5}), served.predict(article, params={"top_k": 5})
    assert a["image_ids"].tolist() == b["image_ids"].tolist() and a["scores"].tolist() == b["scores"].tolist()
