"""synth-news -> Beam build (news-jsonl) -> Ray Train (--objective news, fused, random_drop) ->
test R@K / MedR both directions in MLflow -> the packaged archive-ranking model answers an
article: the one end-to-end run of the news family.

Marked slow: it is the only news test that pays for the feature extractor and a Ray Train fit
(about 30 s on a quiet 2-core machine); the parts are unit-tested in test_news_model.py and
tests/pipelines/test_news_jsonl.py."""

from __future__ import annotations

import pytest

from tests.conftest import tracking_uri


@pytest.mark.slow
def test_news_trains_through_ray_and_logs_its_test_metrics(tmp_path, ray_local):
    from mlflow.tracking import MlflowClient

    from models.experiment import run_experiment
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.news_corpus import NewsSynthConfig, write_news_corpus
    from training.config import TrainConfig

    write_news_corpus(tmp_path / "raw", NewsSynthConfig(articles=24, image_size=48))
    manifest = build_dataset(
        BuildConfig(
            source="news-jsonl",
            input=str(tmp_path / "raw"),
            out=str(tmp_path / "ds"),
            source_options={"split": "ratio", "ratios": "0.6,0.2,0.2"},
        )
    )
    splits = manifest.counts["splits"]
    assert sum(splits.values()) >= 24 and splits.get("val", 0) >= 2 and splits.get("test", 0) >= 2
    cfg = TrainConfig(
        data=str(tmp_path / "ds"),
        objective="news",
        fusion="attention",
        random_drop=0.3,
        subword_buckets=32,
        epochs=1,
        d_shared=16,
        batch_docs=8,
        lr=3e-3,
        min_word_count=1,
        word_vectors="random",
        max_tokens=30,
        num_workers=0,  # in this process (tests/training/test_train.py: the same run as 1 worker)
        storage_path=str(tmp_path / "ray"),
        n_pools=1,
    )
    uri = tracking_uri(tmp_path)
    res = run_experiment(cfg, uri, model_name="news")
    assert res.test["pairs"] == splits["test"] and {"t2i", "i2t"} <= set(res.test)
    # what it learns is test_news_learns.py's: 1 epoch on 24 articles is a plumbing run
    metrics = MlflowClient(uri).get_run(res.run_id).data.metrics
    assert {
        "test_medr",
        "test_r1",
        "test_r5",
        "test_r10",
        "test_i2t_medr",
        "test_i2t_r10",
        "val_medr",
    } <= set(metrics)
    # packaged as the archive-ranking pyfunc (objective packaging "news-archive"), registered
    import mlflow
    import pandas as pd

    assert res.model_uri == "models:/news@candidate" and res.model_version == "1"
    mlflow.set_tracking_uri(uri)
    try:
        served = mlflow.pyfunc.load_model(res.model_uri)
    finally:
        mlflow.set_tracking_uri(None)
    out = served.predict(pd.DataFrame([{"language": "de", "caption": "foto"}]), params={"top_k": 5})
    assert len(out["image_ids"][0]) == 5 and out["scores"][0] == sorted(out["scores"][0], reverse=True)


@pytest.mark.slow
def test_all_for_one_through_ray_starts_from_the_language_a_model(tmp_path, ray_local):
    """`--multilingual all-for-one --init-from DIR` reaches the Ray workers: the trained model
    keeps the language-A checkpoint's weights but the word embeddings, which start from this
    dataset's vectors file (one Ray Train fit of 1 epoch, tiny lr: the weights barely move)."""
    import numpy as np
    import torch

    from training.config import TrainConfig
    from training.driver import fit

    from .helpers import news_checkpoint, write_news_dataset

    data, docs = write_news_dataset(tmp_path / "ds")
    ckpt, vocab = news_checkpoint(tmp_path / "lang-a", docs)  # word_dim 16, d 16: an A model
    start = torch.load(ckpt / "state.pt", weights_only=False)["model"]
    rng = np.random.default_rng(0)
    vectors = {w: rng.uniform(-1, 1, 16).round(4) for w in vocab.words[2:6]}
    (tmp_path / "b.vec").write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in vectors.items()))
    cfg = TrainConfig(
        data=str(data),
        objective="news",
        multilingual="all-for-one",
        init_from=str(ckpt),
        word_vectors=f"text:{tmp_path / 'b.vec'}",
        epochs=1,
        d_shared=16,
        batch_docs=6,
        lr=1e-6,
        min_word_count=1,
        max_tokens=20,
        num_workers=0,  # in this process
        storage_path=str(tmp_path / "ray"),
        n_pools=1,
    )
    res = fit(cfg)
    got = res.model.state_dict()
    for name in ("encoders.caption.ffn.0.weight", "fuser.net.0.weight", "image.proj.weight"):
        if name in got:
            assert torch.allclose(got[name], start[name], atol=1e-4), name
    words = res.model.embed.words.weight.detach()
    kept = [w for w in vectors if w in res.vocab.index]  # the training split's vocabulary
    assert kept
    for w in kept:
        v = vectors[w]
        assert torch.allclose(words[res.vocab.index[w]], torch.tensor(v, dtype=torch.float32), atol=1e-4)
    assert res.model_config["recipe"] == {"multilingual": "all-for-one", "init_from": str(ckpt.resolve())}
