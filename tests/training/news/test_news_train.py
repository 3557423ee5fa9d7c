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

    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.news_corpus import NewsSynthConfig, write_news_corpus
    from training.config import TrainConfig
    from training.experiment import run_experiment

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
        num_workers=0,  # Ray Train local mode (tests/training/test_train.py: the same run as 1 worker)
        storage_path=str(tmp_path / "ray"),
        n_pools=1,
    )
    uri = tracking_uri(tmp_path)
    res = run_experiment(cfg, uri, model_name="news")
    assert res.test["pairs"] == splits["test"] and {"t2i", "i2t"} <= set(res.test)
    assert 0 <= res.test["t2i"]["r10"] <= 100
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
