"""`mmlinks evaluate` and `mmlinks baseline`, run as a user runs them.

The model is a MulLink with random weights saved in the training checkpoint layout (no Ray):
evaluation must not care how good it is, only score it exactly. Each figure is recomputed
independently: one document at a time through the encoders, AUC by counting pairs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cli.main import main
from schemas.manifest import Manifest
from schemas.shards import read_table
from tests.training.test_baselines import make_documents, write_dataset
from tests.training.test_metrics_oracle import brute_auc
from training.text import Vocabulary

MMLINKS = shutil.which("mmlinks", path=str(Path(sys.executable).parent)) or "mmlinks"


def run(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run([MMLINKS, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    docs = make_documents("train", 16, seed=11) + make_documents("val", 6, seed=12)
    docs += make_documents("test", 9, seed=13)
    docs[-1].links = None  # an unlabelled test document: skipped, and counted as skipped
    return write_dataset(tmp_path_factory.mktemp("evaldata"), docs)


@pytest.fixture(scope="module")
def checkpoint(data, tmp_path_factory) -> Path:
    """A checkpoint folder as training writes it (state.pt + meta.json), vocab.json beside it."""
    from training.model import ModelConfig, MulLink

    train = read_table(Manifest.read(data).shard_paths(data, "train"), ["sentences"])
    vocab = Vocabulary.build((s for d in train.column("sentences").to_pylist() for s in d), min_count=1)
    cfg = ModelConfig(vocab_size=len(vocab), word_dim=8, image_dim=1280, d_multi=16)
    torch.manual_seed(0)
    model = MulLink(cfg)
    root = tmp_path_factory.mktemp("model")
    ckpt = root / "checkpoint"
    ckpt.mkdir()
    torch.save({"model": model.state_dict(), "epoch": 0, "val_loss": 1.0, "best_epoch": 0}, ckpt / "state.pt")
    (ckpt / "meta.json").write_text(json.dumps({"model": cfg.to_dict(), "train": {"max_tokens": 20}}))
    vocab.save(root / "vocab.json")
    return ckpt


def brute_force_metrics(data: Path, checkpoint: Path) -> dict[str, dict]:
    """doc_id -> {auc, p_at_1}: one document at a time, straight through the two encoders."""
    from training.checkpoints import load_checkpoint_model

    model, _ = load_checkpoint_model(checkpoint)
    vocab = Vocabulary.load(checkpoint.parent / "vocab.json")
    out = {}
    for doc in read_table(Manifest.read(data).shard_paths(data, "test")).to_pylist():
        if not doc["links"]:
            continue
        ids = [vocab.encode(s, 20) for s in doc["sentences"]]
        tokens = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)
        for i, e in enumerate(ids):
            tokens[i, : len(e)] = torch.tensor(e)
        with torch.no_grad():
            s = model.text(tokens, torch.tensor([len(e) for e in ids]))
            v = model.image(torch.tensor([im["features"] for im in doc["images"]]))
        scores = (s @ v.T).numpy()
        labels = np.zeros(scores.shape, dtype=bool)
        for link in doc["links"]:
            labels[link["sentence"], link["image"]] = True
        best = scores.max()
        out[doc["doc_id"]] = {
            "auc": float(brute_auc(scores, labels)),
            "p_at_1": float(labels[scores == best].mean()),
            "shape": scores.shape,
        }
    return out


@pytest.mark.slow
def test_evaluate_a_checkpoint_with_spread_json(data, checkpoint, tmp_path):
    per_doc_file = tmp_path / "out" / "per_doc.jsonl"
    proc = run(
        "evaluate",
        "--data",
        str(data),
        "--checkpoint",
        str(checkpoint),
        "--per-doc-out",
        str(per_doc_file),
        "--spread",
        "--workdir",
        str(tmp_path),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # stdout holds exactly one JSON object
    want = brute_force_metrics(data, checkpoint)
    assert out["n_docs"] == len(want) == 8 and out["n_skipped"] == 1 and out["split"] == "test"
    assert out["auc"] == pytest.approx(100 * np.mean([w["auc"] for w in want.values()]))
    assert out["p_at_1"] == pytest.approx(100 * np.mean([w["p_at_1"] for w in want.values()]))
    aucs = [100 * w["auc"] for w in want.values()]
    assert out["auc_se"] == pytest.approx(np.std(aucs, ddof=1) / np.sqrt(len(aucs)))
    assert set(out["random"]) == {"auc", "p_at_1", "p_at_5", "n_docs", "auc_se"}
    assert out["per_doc"] == str(per_doc_file.resolve())
    rows = [json.loads(line) for line in per_doc_file.read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == sorted(want)
    for r in rows:
        assert r["auc"] == pytest.approx(want[r["doc_id"]]["auc"])
        assert (r["n_sentences"], r["n_images"]) == want[r["doc_id"]]["shape"]
        assert 0 <= r["image_spread"] <= 1 and 0 <= r["text_spread"] <= 1
    sp = out["spread"]
    assert sp["n_docs"] == 8 and 0 <= sp["spread"]["r2"] <= 1
    assert sp["spread_content"]["saturated"]  # 8 documents cannot support 2 + 2 x 7 regressors
    assert sp["spread_content"]["adj_r2"] is None


def _log_model(checkpoint: Path, workdir: Path) -> str:
    import mlflow

    from models.packaging import log_link_model
    from training import tracking

    uri = tracking.tracking_uri(workdir)
    tracking.configure(uri, "mmlinks")
    mlflow.set_experiment("mmlinks")
    with mlflow.start_run():
        return log_link_model(str(checkpoint), Vocabulary.load(checkpoint.parent / "vocab.json"), None, None)


@pytest.mark.slow
def test_evaluate_a_model_uri_gives_the_checkpoint_figures(data, checkpoint, tmp_path, monkeypatch, capsys):
    from training.evaluate import evaluate, load_checkpoint

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model_uri = _log_model(checkpoint, tmp_path)
    target = tmp_path / "uri.jsonl"
    args = ["evaluate", "--data", str(data), "--model-uri", model_uri, "--workdir", str(tmp_path)]
    assert main([*args, "--per-doc-out", str(target)]) == 0
    text = capsys.readouterr().out
    model, vocab, max_tokens = load_checkpoint(checkpoint)
    want = evaluate(model, vocab, data, "test", max_tokens)
    assert f"model   {want['model']['auc']:.1f}" in text and "Random" in text
    aucs = [100 * d["auc"] for d in want["per_doc"]]  # the AUC's noise over the split's documents
    assert f"AUC standard error {np.std(aucs, ddof=1) / np.sqrt(len(aucs)):.2f})" in text
    assert [json.loads(line) for line in target.read_text().splitlines()] == want["per_doc"]
    assert main(args) == 0  # default file: WORKDIR/evaluations/model-test-TIME.jsonl, never overwritten
    assert main(args) == 0
    assert len(list((tmp_path / "evaluations").glob("model-test-*.jsonl"))) == 2


@pytest.mark.slow
def test_baseline_object_detection_json(data, tmp_path):
    args = ["--method", "object-detection", "--k-max", "4", "--workdir", str(tmp_path), "--json"]
    proc = run("baseline", "--data", str(data), *args)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["method"] == "object-detection" and out["selected_on"] == "val"
    assert [p["k"] for p in out["per_k"]] == [1, 2, 3, 4]
    assert out["auc"] == out["per_k"][out["best_k"] - 1]["test"]["auc"]
    assert out["oracle"]["auc"] == max(p["test"]["auc"] for p in out["per_k"])
    assert Path(out["per_doc"]).parent == (tmp_path / "evaluations").resolve()
    rows = Path(out["per_doc"]).read_text().splitlines()
    assert len(rows) == out["n_docs"] == 8


def test_baseline_random_prints_a_table(data, tmp_path, capsys):
    assert main(["baseline", "--data", str(data), "--method", "random", "--workdir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "Random" in text and "AUC" in text and "per-document values:" in text


def test_nostruct_trains_the_nostruct_objective_unregistered(data, tmp_path, monkeypatch, capsys):
    import models.experiment
    import training.experiment

    seen = {}

    def fake_run_experiment(cfg, uri, model_name="x", alias="y", progress=False):
        seen.update(cfg=cfg, uri=uri, model_name=model_name, alias=alias)
        test = {"auc": 61.0, "p_at_1": 30.0, "p_at_5": 25.0, "n_docs": 8}
        return training.experiment.ExperimentResult(
            "run1", "runs:/run1/model", None, 2, test, test, uri, "r.html"
        )

    monkeypatch.setattr(models.experiment, "run_experiment", fake_run_experiment)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = ["baseline", "--data", str(data), "--method", "nostruct", "--epochs", "3", "--workers", "1"]
    assert main([*args, "--workdir", str(tmp_path)]) == 0
    assert seen["cfg"].objective == "nostruct" and seen["cfg"].epochs == 3 and seen["cfg"].num_workers == 1
    assert seen["model_name"] is None and seen["alias"] is None
    assert seen["uri"] == f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
    assert "NoStruct  61.0" in capsys.readouterr().out
    assert main([*args, "--split", "val"]) == 2  # NoStruct is scored on test only


@pytest.mark.parametrize(
    "argv, message",
    [
        (["evaluate", "--data", "{data}", "--checkpoint", "{bare}"], "no vocabulary for checkpoint"),
        (["evaluate", "--data", "{data}", "--checkpoint", "{data}"], "is not a training checkpoint"),
        (["evaluate", "--data", "{missing}", "--checkpoint", "{bare}"], "does not exist"),
        (["baseline", "--data", "{data}", "--method", "object-detection", "--k-max", "0"], "--k-max"),
        (["baseline", "--data", "{data}", "--method", "random", "--split", "nope"], "no 'nope' shards"),
    ],
)
def test_errors_are_one_line(data, checkpoint, tmp_path, capsys, argv, message):
    bare = tmp_path / "bare"
    shutil.copytree(checkpoint, bare)  # no vocab.json inside or beside it
    values = {"data": str(data), "bare": str(bare), "missing": str(tmp_path / "missing")}
    assert main([a.format(**values) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mmlinks: error: ") and message in err and "\n" not in err


def test_evaluate_needs_exactly_one_model_and_both_commands_have_help(data, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--data", str(data)])
    assert exc.value.code == 2 and "--model-uri" in capsys.readouterr().err
    for command in ("evaluate", "baseline"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        assert "--json" in text and "--per-doc-out" in text and "--split" in text


@pytest.mark.slow
def test_nostruct_baseline_trains_with_ray(data, tmp_path, ray_local):
    import ray

    proc = run(
        "baseline",
        "--ray-address",  # the session's Ray: a CLI run joins a cluster instead of starting one
        ray.get_runtime_context().gcs_address,
        "--data",
        str(data),
        "--method",
        "nostruct",
        "--epochs",
        "2",
        "--d-multi",
        "16",
        "--batch-docs",
        "4",
        "--min-word-count",
        "1",
        "--workers",
        "0",  # the loop in the CLI's process (Ray Data on the session's Ray)
        "--workdir",
        str(tmp_path),
        "--per-doc-out",
        str(tmp_path / "ns.jsonl"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["method"] == "nostruct" and out["n_docs"] == 8 and 0 <= out["auc"] <= 100
    assert len((tmp_path / "ns.jsonl").read_text().splitlines()) == 8
