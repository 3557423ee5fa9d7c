"""A registered model's files damaged in place (issue #62): every loader refuses it in one line
naming the file, and ``promote`` never moves ``production`` to it. The digests are recorded when
the model is logged (``models/integrity.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from models.integrity import DIGESTS_KEY, artifact_digests, file_sha256, verify_artifacts
from pipelines.feature_corpus import FeatureCorpusConfig, write_feature_corpus
from schemas.errors import MmlinksError

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "zeros":  # still a loadable torch file: only the digest tells
        start = len(data) // 2
        data[start : start + 4096] = bytes(min(4096, len(data) - start))
        path.write_bytes(bytes(data))
    elif how == "nan":
        import torch

        state = torch.load(path, map_location="cpu", weights_only=False)

        def tensors(obj):
            if isinstance(obj, torch.Tensor):
                yield obj
            elif isinstance(obj, dict):
                for v in obj.values():
                    yield from tensors(v)

        first = next(t for t in tensors(state) if t.is_floating_point())
        first.fill_(float("nan"))  # a loadable file whose weights score nothing
        torch.save(state, path)
    elif how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 3]))
    else:
        path.unlink()


def test_digests_name_the_file_that_differs_or_is_missing(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "state.pt").write_bytes(b"weights" * 100)
    (folder / "meta.json").write_text("{}")
    vocab = tmp_path / "vocab.json"
    vocab.write_text("[]")
    artifacts = {"checkpoint": str(folder), "vocab": str(vocab)}
    digests = artifact_digests(artifacts)
    assert set(digests["checkpoint"]) == {"state.pt", "meta.json"} and digests["vocab"] == file_sha256(vocab)
    verify_artifacts(artifacts, {DIGESTS_KEY: digests})  # intact
    verify_artifacts(artifacts, {})  # a model logged before the digests: nothing to check
    # versions registered before 2026-11-28 record a single file's digest under ""
    verify_artifacts(artifacts, {DIGESTS_KEY: {**digests, "vocab": {"": digests["vocab"]}}})
    (folder / "state.pt").write_bytes(b"weights" * 99 + b"weighTs")
    with pytest.raises(MmlinksError, match=r"damaged model: checkpoint/state.pt differs"):
        verify_artifacts(artifacts, {DIGESTS_KEY: digests})
    vocab.unlink()
    with pytest.raises(MmlinksError, match=r"damaged model: vocab is missing"):
        verify_artifacts(
            {"checkpoint": str(folder), "vocab": str(vocab)}, {DIGESTS_KEY: {"vocab": digests["vocab"]}}
        )


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A small bag model trained, registered as candidate and promoted to production once; then a
    second candidate to damage."""
    from cli.main import main

    root = tmp_path_factory.mktemp("integrity")
    data, wd = root / "ds", root / "wd"
    write_feature_corpus(data, FeatureCorpusConfig(docs=80, val_docs=20, test_docs=20, topics=4, dim=16))
    args = ["train", "--data", str(data), "--backbone", "bag", "--workers", "0", "--epochs", "2"]
    args += ["--d-multi", "16", "--min-word-count", "1", "--workdir", str(wd), "--json"]
    assert main(args) == 0
    assert main(["promote", "--data", str(data), "--workdir", str(wd), "--json"]) == 0
    assert main([*args, "--seed", "1"]) == 0  # version 2: the candidate
    return data, wd


def test_every_digest_is_a_parameter_of_the_run_that_logged_the_model(registered):
    """MLflow logs a model's model_config as its run's parameters, flattened with "/": each file's
    digest is one (the single-file artifacts' were keyed "DIGESTS_KEY/vocab/", no valid name, and
    MLflow logged none of them, with a warning)."""
    import mlflow

    _, wd = registered
    client = mlflow.MlflowClient(f"sqlite:///{wd / 'mlflow.db'}")
    version = client.get_model_version_by_alias("mmlinks-ap", "candidate")
    params = client.get_run(version.run_id).data.params
    logged = {k.removeprefix(f"{DIGESTS_KEY}/") for k in params if k.startswith(f"{DIGESTS_KEY}/")}
    assert {"vocab", "checkpoint/state.pt", "checkpoint/meta.json"} <= logged, sorted(params)


def _candidate_files(wd: Path) -> list[Path]:
    """The registered candidate's weight files in the tracking store (every copy MLflow keeps)."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{wd / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    version = client.get_model_version_by_alias("mmlinks-ap", "candidate")
    model_id = version.source.removeprefix("models:/")  # the logged model (MLflow 3)
    files = sorted(p for p in wd.rglob("state.pt") if model_id in p.parts)
    root = wd
    assert files, f"no weights under {root}"
    return files


def _cli(wd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args, "--workdir", str(wd)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


@pytest.mark.parametrize("how", ["zeros", "nan", "truncated", "deleted"])
def test_a_damaged_registered_model_is_refused_by_every_loader_and_never_promoted(
    registered, tmp_path, how, fault_stats
):
    import mlflow

    data, wd = registered
    files = _candidate_files(wd)
    saved = {p: p.read_bytes() for p in files}
    try:
        for p in files:
            _damage(p, how)
        fault_stats.add(faults_injected=len(files))
        # the pyfunc loader (serving, link, evaluate and the gate load through it)
        with pytest.raises(MmlinksError, match=r"damaged model: checkpoint/state.pt (differs|is missing)"):
            mlflow.pyfunc.load_model("models:/mmlinks-ap@candidate")
        # promote: refused in one line, production left where it was
        before = mlflow.MlflowClient().get_model_version_by_alias("mmlinks-ap", "production").version
        done = _cli(wd, "promote", "--data", str(data))
        assert done.returncode != 0
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        assert lines and lines[-1].startswith("mmlinks: error:") and "checkpoint/state.pt" in lines[-1]
        after = mlflow.MlflowClient().get_model_version_by_alias("mmlinks-ap", "production").version
        assert after == before
        # link: one line too
        out = tmp_path / "links"
        done = _cli(
            wd, "link", "--data", str(data), "--model", "models:/mmlinks-ap@candidate", "--out", str(out)
        )
        assert done.returncode != 0 and "checkpoint/state.pt" in done.stderr.strip().splitlines()[-1]
        fault_stats.add(invariant_checks=3)
    finally:
        for p, content in saved.items():
            p.write_bytes(content)
    model = mlflow.pyfunc.load_model("models:/mmlinks-ap@candidate")  # restored: loads again
    request = pd.DataFrame(
        {"sentences": [["a two"]], "image_features": [[np.ones(16).tolist(), np.zeros(16).tolist()]]}
    )
    assert len(model.predict(request)) == 1


def test_the_gate_refuses_a_candidate_whose_re_evaluation_disagrees_with_its_run(tmp_path):
    """A version registered before the digests existed carries none; the gate's re-evaluation on
    the data its run was tested on must then agree with the run's logged test AUC (issue #62)."""
    from mlflow import MlflowClient

    from models.registry import REEVALUATION_TOLERANCE, check_reevaluation
    from schemas.manifest import Manifest

    data = tmp_path / "ds"
    write_feature_corpus(data, FeatureCorpusConfig(docs=20, val_docs=5, test_docs=5, topics=2, dim=8))
    manifest = Manifest.read(data)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("e"))
    client.log_param(run.info.run_id, "dataset_version", manifest.dataset_version)
    client.log_metric(run.info.run_id, "test_auc", 50.3)
    client.create_registered_model("m")
    version = client.create_model_version("m", f"runs:/{run.info.run_id}/model", run.info.run_id).version

    assert (
        check_reevaluation(client, "m", version, manifest, "test", {"auc": 50.3 + REEVALUATION_TOLERANCE})
        == []
    )
    failures = check_reevaluation(client, "m", version, manifest, "test", {"auc": 46.5})
    assert len(failures) == 1 and "46.50 differs from the 50.30" in failures[0]
    assert check_reevaluation(client, "m", version, manifest, "val", {"auc": 46.5}) == []  # other split
    other = Manifest.read(data)
    other.dataset_version = "another"
    assert check_reevaluation(client, "m", version, other, "test", {"auc": 46.5}) == []  # other data
