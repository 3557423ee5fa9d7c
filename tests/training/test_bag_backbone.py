"""``--backbone bag``, the simplest model (issue #44): it trains, registers, serves and links like
every backbone, and the default model does not fall below it on a corpus whose topics share a
look and a vocabulary."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cli.main import main
from pipelines.feature_corpus import FeatureCorpusConfig, write_feature_corpus
from training.backbone import build_model

pytestmark = pytest.mark.slow


def test_bag_is_mean_word_embedding_plus_linear_and_a_linear_image_projection():
    cfg = {
        "vocab_size": 30,
        "word_dim": 8,
        "image_dim": 12,
        "d_multi": 6,
        "backbone": "bag",
        "text_pooling": "bag",
        "image_centring": "none",
        "image_dropout": 0.0,
    }
    model = build_model(cfg)
    names = sorted(n for n, _ in model.named_parameters())
    assert names == [
        "image.proj.bias",
        "image.proj.weight",
        "text.embed.weight",
        "text.proj.bias",
        "text.proj.weight",
    ]


def test_bag_trains_registers_serves_and_links(tmp_path, capsys):
    import mlflow

    data, wd = tmp_path / "ds", tmp_path / "wd"
    cfg = FeatureCorpusConfig(docs=80, val_docs=20, test_docs=20, topics=4, dim=16)
    write_feature_corpus(data, cfg)
    args = ["train", "--data", str(data), "--backbone", "bag", "--workers", "0", "--epochs", "2"]
    args += ["--d-multi", "16", "--min-word-count", "1", "--workdir", str(wd), "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["test"]["auc"] > 0 and result["model_uri"].startswith("models:/mmlinks-ap/")

    mlflow.set_tracking_uri(f"sqlite:///{wd / 'mlflow.db'}")
    served = mlflow.pyfunc.load_model(result["model_uri"])
    request = pd.DataFrame(
        {
            "sentences": [["the digit one", "here is the photo of a two"]],
            "image_features": [[np.ones(16).tolist(), np.zeros(16).tolist(), np.full(16, 0.5).tolist()]],
        }
    )
    answer = served.predict(request)
    assert np.asarray(answer["scores"][0]).shape == (2, 3) and len(answer["links"][0]) <= 2

    out = tmp_path / "links"
    link = ["link", "--data", str(data), "--model", "models:/mmlinks-ap@candidate", "--out", str(out)]
    assert (
        main([*link, "--workdir", str(wd), "--direct-workers", "1", "--split", "test", "--eval", "--json"])
        == 0
    )
    linked = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert linked["counts"]["documents_linked"] == 20
