"""``--backbone bag``, the simplest model (issue #44): it trains, registers, serves and links like
every backbone, and the default model does not fall below it on a corpus whose topics share a
look and a vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_bag_trains_registers_serves_and_links(tmp_path, capfd):
    import mlflow

    data, wd = tmp_path / "ds", tmp_path / "wd"
    cfg = FeatureCorpusConfig(docs=80, val_docs=20, test_docs=20, topics=4, dim=16)
    write_feature_corpus(data, cfg)
    args = ["train", "--data", str(data), "--backbone", "bag", "--workers", "0", "--epochs", "2"]
    args += ["--d-multi", "16", "--min-word-count", "1", "--workdir", str(wd), "--json"]
    assert main(args) == 0
    result = json.loads(capfd.readouterr().out)
    assert result["test"]["auc"] > 0 and result["model_uri"] == "models:/mmlinks-ap@candidate"

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
    linked = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert linked["documents_linked"] == 20 and linked["evaluation"]["labelled_documents"] == 20


def _run(data, tmp_path, name: str, **overrides):
    from models.experiment import run_experiment
    from training.config import TrainConfig

    cfg = TrainConfig(data=str(data), epochs=10, d_multi=256, lr=1e-3, num_workers=0, **overrides)
    wd = tmp_path / name
    wd.mkdir()
    return run_experiment(cfg, f"sqlite:///{wd}/mlflow.db", None, None, report_dir=wd)


def _test_auc(data, tmp_path, name: str, **overrides) -> float:
    return _run(data, tmp_path, name, **overrides).test["auc"]


def test_the_default_does_not_fall_below_the_bag_baseline_when_topics_share_a_look(tmp_path):
    """Issue #44's regression test: documents of one of 10 topics share a look (clipped at zero,
    image ratio ~13) and the topic's words; the default model, trained beside the simplest one on
    the same corpus at the demo's settings, must stay within a few points of it (benchmarks'
    grid cell `topic:10:clipped:5.0`). Before the fix (GloVe vectors, random batches) the default
    stayed at AUC 63 on a corpus of this structure where the bag reached 99 (docs/benchmarks-linking.md).
    1,000 documents (was 1,500: a third of the suite's longest test): bag 99.1, default 98.2. On
    a smaller corpus (600 documents, 6 epochs, d_multi 64) the default still learns more slowly
    than the bag."""
    data = tmp_path / "ds"
    cfg = FeatureCorpusConfig(
        docs=1000, val_docs=100, test_docs=100, topics=10, look_mixing="clipped", look_strength=5.0
    )
    write_feature_corpus(data, cfg)
    bag = _test_auc(data, tmp_path, "bag", backbone="bag", negatives_warmup=0, select_by="last")
    default = _test_auc(data, tmp_path, "default")
    assert bag > 80, f"the corpus must be learnable by the simplest model (bag AUC {bag:.1f})"
    assert default >= bag - 4, f"default AUC {default:.1f} fell below the bag baseline's {bag:.1f}"


@pytest.mark.parametrize(
    ("name", "structure"),
    [
        # issue #60's held-out structures: 2-3 images per document whose topic's and own looks add
        # up (the old threshold rule picked balanced centring with dropout 0.4: 91.2 vs the bag's
        # 97.7 there), and topics photographed in three looks, one per image (its pick, none with
        # dropout 0.4, reached 76.6 here where the bag reached 92.8)
        (
            "two-three-images",
            dict(topics=15, look_sharing="topic+document", look_strength=5.5, images_min=2, images_max=3),
        ),
        ("three-looks", dict(docs=1500, topics=40, look_strength=4.1, looks_per_topic=3)),
    ],
)
def test_the_measured_default_stays_with_the_bag_on_every_structure(tmp_path, name, structure):
    """Issue #60's regression test: the default (its image side chosen by measuring the corpus)
    trained beside the bag on the same corpus at the demo's settings stays within a few points of
    it, and the run records what it chose and why (MLflow and the report)."""
    import mlflow

    data = tmp_path / "ds"
    write_feature_corpus(
        data, FeatureCorpusConfig(**{"docs": 1000, "val_docs": 100, "test_docs": 100, **structure})
    )
    bag = _test_auc(data, tmp_path, "bag", backbone="bag", negatives_warmup=0, select_by="last")
    default = _run(data, tmp_path, "default")
    assert bag > 80, f"the corpus must be learnable by the simplest model (bag AUC {bag:.1f})"
    auc = default.test["auc"]
    assert auc >= bag - 3, f"{name}: default AUC {auc:.1f} fell below the bag's {bag:.1f} ({default.choice})"
    chosen = default.choice["name"]
    assert set(default.choice["scores"]) == {"none", "balanced", "balanced+dropout", "bag"}
    run = mlflow.MlflowClient(default.tracking_uri).get_run(default.run_id)
    assert run.data.params["choice"] == chosen
    assert {f"choice_score.{k.replace('+', '_')}" for k in default.choice["scores"]} <= set(run.data.metrics)
    report = Path(default.report_path).read_text()
    assert "image side (measured)" in report and chosen in report
