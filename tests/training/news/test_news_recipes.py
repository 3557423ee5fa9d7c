"""Liu et al.'s recipes that start a news model from other weights (training/news/recipes.py):
one for all (frozen aligned word vectors), all for one (a language-A model with language B's
vectors swapped in), divide and conquer (single-source encoders, then the fuser alone for the
warm-up epochs), and the aligned vector files they read. Tiny models, no Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from schemas.errors import MmlinksError
from training.checkpoints import CHECKPOINT_FILE
from training.config import TrainConfig
from training.news import recipes
from training.news.model import NewsConfig, NewsRetrieval
from training.news.objective import absolute_init, build
from training.news.recipes import parse_init
from training.objectives.registry import objective_loss
from training.text import embedding_matrix

from .test_news_model import _batch

W, IMG = 8, 6


def _cfg(vocab_size: int, sources=("headline", "lead", "body", "caption"), **kw) -> dict:
    return NewsConfig(
        vocab_size=vocab_size, word_dim=W, image_dim=IMG, d=8, d_hidden=8, sources=sources, **kw
    ).to_dict()


def _save(folder, net: NewsRetrieval):
    folder.mkdir(parents=True)
    torch.save(
        {"model": net.state_dict(), "epoch": 0, "val_loss": 0.0, "best_epoch": 0}, folder / CHECKPOINT_FILE
    )
    (folder / "meta.json").write_text(json.dumps({"model": net.cfg.to_dict()}))
    return folder


def _trained(vocab_size: int, seed: int, **kw) -> NewsRetrieval:
    torch.manual_seed(seed)
    net = NewsRetrieval(NewsConfig(**_cfg(vocab_size, **kw)))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p))  # anything a fresh model would not have
    return net


def _same(a: dict, b: dict, prefix: str) -> bool:
    keys = [k for k in a if k.startswith(prefix)]
    return bool(keys) and all(torch.equal(a[k], b[k]) for k in keys)


def test_init_from_forms_and_config_rules(tmp_path, monkeypatch):
    assert recipes.CHECKPOINT_FILE == CHECKPOINT_FILE
    assert parse_init("") == {} and parse_init("/x/ckpt") == {"": "/x/ckpt"}
    assert parse_init("caption=/a, headline=/b") == {"caption": "/a", "headline": "/b"}
    for bad in ("title=/a", "caption=/a,caption=/b", "caption="):
        with pytest.raises(ValueError):
            parse_init(bad)
    monkeypatch.chdir(tmp_path)
    assert absolute_init("caption=rel") == f"caption={tmp_path / 'rel'}" and absolute_init("") == ""
    with pytest.raises(MmlinksError, match="init_from"):
        TrainConfig(objective="news", multilingual="all-for-one")
    with pytest.raises(MmlinksError, match="word_vectors"):
        TrainConfig(objective="news", multilingual="one-for-all", word_vectors="random")
    with pytest.raises(MmlinksError, match="fuser_warmup_epochs"):
        TrainConfig(objective="news", fuser_warmup_epochs=1, news_recipe="joint")
    with pytest.raises(MmlinksError, match="fuser_warmup_epochs"):  # one source: nothing staged
        TrainConfig(objective="news", fuser_warmup_epochs=1, news_sources="caption")
    TrainConfig(objective="news", fuser_warmup_epochs=2)  # the staged recipe's fusion stage reads it
    with pytest.raises(MmlinksError, match="2\\+"):
        TrainConfig(objective="news", news_sources="caption", init_from="caption=/a")
    ok = TrainConfig(objective="news", multilingual="all-for-one", init_from="/a", word_vectors="x.vec")
    assert ok.label.endswith("-afo")
    assert TrainConfig(objective="news", init_from="caption=/a,lead=/b").label.endswith("-dc")


def test_all_for_one_takes_every_weight_but_the_word_embeddings(tmp_path):
    a = _trained(10, seed=1)
    ckpt = _save(tmp_path / "a", a)
    emb_b = np.random.default_rng(0).uniform(-1, 1, (13, W)).astype(np.float32)  # B's vocabulary
    recipe = {"multilingual": "all-for-one", "init_from": str(ckpt)}
    b = build({**_cfg(13), "recipe": recipe}, emb_b)
    got, want = b.state_dict(), a.state_dict()
    for prefix in ("encoders.", "fuser.", "image."):
        assert _same(got, want, prefix), prefix
    assert torch.equal(got["embed.words.weight"], torch.from_numpy(emb_b))
    assert b.embed.words.weight.requires_grad  # fine-tuned in language B
    # a checkpoint read back (no embeddings) does not read the init files again
    (ckpt / CHECKPOINT_FILE).unlink()
    assert build({**_cfg(13), "recipe": recipe}) is not None
    with pytest.raises(MmlinksError, match="not a checkpoint folder"):
        build({**_cfg(13), "recipe": recipe}, emb_b)


def test_a_different_architecture_is_refused_in_one_line(tmp_path):
    ckpt = _save(tmp_path / "a", _trained(10, seed=1, fusion="max"))
    recipe = {"multilingual": "all-for-one", "init_from": str(ckpt)}
    with pytest.raises(MmlinksError, match="fusion max there"):
        build({**_cfg(10), "recipe": recipe}, np.zeros((10, W), np.float32))
    wide = _save(tmp_path / "w", NewsRetrieval(NewsConfig(**{**_cfg(10), "d": 16, "d_hidden": 16})))
    with pytest.raises(MmlinksError, match="d 16 there, 8 here"):
        build({**_cfg(10), "recipe": {**recipe, "init_from": str(wide)}}, np.zeros((10, W), np.float32))


def test_auto_subword_buckets_follow_the_init_from_model(tmp_path):
    """-1 (auto) takes the checkpoint's n-gram table size, so a model from before subwords (0)
    or with its own (7) starts a run without an architecture error; explicit values win."""
    from training.news.objective import AUTO_SUBWORD_BUCKETS, subword_buckets

    old = _save(tmp_path / "old", _trained(10, seed=1))
    words = tuple(f"w{i}" for i in range(10))
    grams = _save(tmp_path / "grams", _trained(10, seed=1, subword_buckets=7, words=words))
    auto = dict(objective="news", multilingual="all-for-one", word_vectors="x.vec")
    assert subword_buckets(TrainConfig(**auto, init_from=str(old))) == 0
    assert subword_buckets(TrainConfig(**auto, init_from=str(grams))) == 7
    assert subword_buckets(TrainConfig(objective="news", init_from=f"caption={grams},lead={old}")) == 7
    assert subword_buckets(TrainConfig(**auto, init_from=str(tmp_path / "missing"))) == AUTO_SUBWORD_BUCKETS
    assert subword_buckets(TrainConfig(**auto, init_from=str(old), subword_buckets=5)) == 5
    (old / "meta.json").write_text("{not json")  # a damaged checkpoint: one line, not a traceback
    with pytest.raises(MmlinksError, match=r"meta\.json is not JSON"):
        build(
            {**_cfg(10), "recipe": {"multilingual": "all-for-one", "init_from": str(old)}}, np.zeros((10, W))
        )


def test_one_for_all_freezes_the_aligned_word_vectors_and_trains_the_rest():
    batch, vocab = _batch(6)
    emb, _ = embedding_matrix(vocab, "random", dim=W)
    torch.manual_seed(0)
    net = build({**_cfg(len(vocab)), "recipe": {"multilingual": "one-for-all", "init_from": ""}}, emb).train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    cfg = TrainConfig(objective="news", multilingual="one-for-all", word_vectors="x.vec")
    loss, _ = objective_loss(net, batch, cfg)
    loss.backward()
    opt.step()
    after = net.state_dict()
    assert torch.equal(after["embed.words.weight"], before["embed.words.weight"])
    assert not torch.equal(after["fuser.net.0.weight"], before["fuser.net.0.weight"])
    assert not _same(after, before, "encoders.caption.")


def test_divide_and_conquer_loads_each_encoder_from_its_single_source_model(tmp_path):
    cap = _trained(10, seed=1, sources=("caption",))
    head = _trained(10, seed=2, sources=("headline",))
    init = f"caption={_save(tmp_path / 'c', cap)},headline={_save(tmp_path / 'h', head)}"
    fresh = NewsRetrieval(NewsConfig(**_cfg(10, sources=("headline", "caption"))))
    net = build(
        {**_cfg(10, sources=("headline", "caption")), "recipe": {"multilingual": "none", "init_from": init}},
        np.zeros((10, W), np.float32),
    )
    got = net.state_dict()
    assert _same(got, cap.state_dict(), "encoders.caption.") and _same(
        got, head.state_dict(), "encoders.headline."
    )
    # the shared parts from the first listed (the caption model), the fuser left fresh
    assert _same(got, cap.state_dict(), "embed.") and _same(got, cap.state_dict(), "image.")
    assert not torch.equal(got["fuser.net.0.weight"], cap.state_dict()["fuser.net.0.weight"])
    assert got["fuser.net.0.weight"].shape == fresh.state_dict()["fuser.net.0.weight"].shape
    with pytest.raises(MmlinksError, match="does not read lead"):
        build(
            {**_cfg(10, sources=("lead", "caption")), "recipe": {"init_from": f"lead={tmp_path / 'c'}"}},
            np.zeros((10, W), np.float32),
        )


def test_fuser_warmup_epochs_train_only_the_fuser():
    batch, vocab = _batch(6)
    torch.manual_seed(0)
    net = NewsRetrieval(NewsConfig(**_cfg(len(vocab)))).train()
    cfg = TrainConfig(objective="news", init_from="caption=/a,lead=/b", fuser_warmup_epochs=1)

    def grads(epoch):
        net.zero_grad()
        objective_loss(net, batch, cfg, epoch=epoch)[0].backward()
        return {
            n: (p.grad.abs().sum().item() if p.grad is not None else 0.0) for n, p in net.named_parameters()
        }

    warm, later = grads(0), grads(1)
    assert all(v == 0 for n, v in warm.items() if not n.startswith("fuser."))
    assert sum(v for n, v in warm.items() if n.startswith("fuser.")) > 0
    assert later["encoders.caption.ffn.0.weight"] > 0
    assert sum(v for n, v in later.items() if n.startswith("image.")) > 0


def test_several_aligned_vector_files_merge_and_the_synthetic_ones_are_aligned(tmp_path):
    from pipelines.news_corpus import LEXICON, aligned_vectors, write_vectors
    from training.word_vectors import load_vectors

    en, de = write_vectors(tmp_path, dim=16, seed=0, oov_rate=0.2)
    tables = aligned_vectors(16, seed=0, oov_rate=0.2)
    assert 0.6 < len(tables["de"]) / len(tables["en"]) < 0.95  # some de words left out
    close = [float(tables["en"][w] @ tables["de"][t]) for w, t in LEXICON.items() if t in tables["de"]]
    assert min(close) > 0.9  # a translation's vector is its word's, plus a little noise
    found, dim, stats = load_vectors(f"text:{en},text:{de}", ["red", "rot", "kreis", "nothing"])
    assert dim == 16 and {"red"} <= set(found) and "nothing" not in found and stats.found == len(found)
    assert np.allclose(found["red"], tables["en"]["red"], atol=1e-4)
    (tmp_path / "short.vec").write_text("1 3\nrot 1 2 3\n")
    with pytest.raises(MmlinksError, match="3-d"):
        load_vectors(f"text:{en},text:{tmp_path / 'short.vec'}", ["red", "rot"])
