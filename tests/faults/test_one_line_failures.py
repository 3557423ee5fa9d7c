"""``mmlinks train`` and ``mmlinks link`` end in one line when the machine around them fails
(issue #62): a full disk, a tracking server that does not answer, a tracking database another
process holds locked. They printed 94-624 lines of library tracebacks and no ``mmlinks: error:``."""

from __future__ import annotations

import errno
import json
import socket
import sqlite3
import threading

import pytest

from cli.failures import explain
from cli.main import main
from pipelines.feature_corpus import FeatureCorpusConfig, write_feature_corpus
from schemas.errors import RetryLaterError

pytestmark = [pytest.mark.faults, pytest.mark.slow]

TRAIN = [
    "--workers",
    "0",
    "--epochs",
    "1",
    "--d-multi",
    "16",
    "--min-word-count",
    "1",
    "--image-centring",
    "none",
]


def _one_error_line(capfd) -> tuple[str, str]:
    out, err = capfd.readouterr()
    lines = [
        ln
        for ln in err.strip().splitlines()
        if ln.strip() and not ln.startswith(("train:", "linking", "beam link"))
    ]
    assert len(lines) == 1 and lines[0].startswith("mmlinks: error: "), lines[-20:]
    assert "Traceback" not in err
    return lines[0], out


def test_explain_names_the_failure_in_the_chain_or_in_a_runners_text():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/out/x.parquet")
        except OSError as inner:
            raise RuntimeError("a worker failed") from inner
    except RuntimeError as exc:
        assert "out of space writing /data/out/x.parquet" in str(explain(exc))
    beam = RuntimeError("OSError: [Errno 28] No space left on device: '/o' [while running 'WriteShards']")
    assert "out of space in WriteShards" in str(explain(beam))
    locked = explain(sqlite3.OperationalError("database is locked"))
    assert isinstance(locked, RetryLaterError) and "locked" in str(locked)
    server = explain(
        Exception("API request to http://mlflow:5000/api/2.0/mlflow/runs/create failed with exception X")
    )
    assert isinstance(server, RetryLaterError) and "server at http://mlflow:5000 does not answer" in str(
        server
    )
    assert explain(ValueError("a bug")) is None  # everything else keeps its traceback


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    data = tmp_path_factory.mktemp("failures") / "ds"
    write_feature_corpus(data, FeatureCorpusConfig(docs=60, val_docs=12, test_docs=12, topics=4, dim=16))
    return data


def test_train_with_the_tracking_server_gone_ends_in_one_line(corpus, tmp_path, monkeypatch, capfd):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    code = main(["train", "--data", str(corpus), *TRAIN, "--workdir", str(tmp_path), "--json"])
    line, out = _one_error_line(capfd)
    assert code == 75 and f"server at http://127.0.0.1:{port} does not answer" in line
    assert json.loads(out)["exit_code"] == 75


def test_train_with_the_tracking_database_locked_ends_in_one_line(corpus, tmp_path, monkeypatch, capfd):
    import training.tracking

    db = tmp_path / "mlflow.db"
    assert main(["train", "--data", str(corpus), *TRAIN, "--workdir", str(tmp_path)]) == 0  # the store exists
    # MLflow's "Successfully registered model" / "Created version" stay off the terminal
    assert "registered model" not in capfd.readouterr().err.lower()
    monkeypatch.setattr(training.tracking, "SQLITE_BUSY_TIMEOUT_S", 1)
    held, release = threading.Event(), threading.Event()

    def hold():
        c = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        c.execute("BEGIN EXCLUSIVE")
        held.set()
        release.wait(120)
        c.execute("ROLLBACK")
        c.close()

    t = threading.Thread(target=hold)
    t.start()
    try:
        held.wait(10)
        code = main(["train", "--data", str(corpus), *TRAIN, "--workdir", str(tmp_path), "--seed", "1"])
    finally:
        release.set()
        t.join()
    line, _ = _one_error_line(capfd)
    assert code == 75 and "tracking database is locked" in line


def test_train_on_a_full_disk_ends_in_one_line_and_its_run_failed(corpus, tmp_path, monkeypatch, capfd):
    import mlflow

    import training.experiment

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "reports" / "r.html"))

    monkeypatch.setattr(training.experiment, "_report", full)  # the report written after training
    code = main(["train", "--data", str(corpus), *TRAIN, "--workdir", str(tmp_path)])
    line, _ = _one_error_line(capfd)
    assert code == 2 and "out of space writing" in line and "r.html" in line
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = mlflow.search_runs(experiment_names=["mmlinks"], output_format="list")
    assert run.info.status == "FAILED"  # the store could still be written: the run is not left RUNNING


def test_a_full_disk_while_the_model_is_copied_leaves_no_half_written_model(
    corpus, tmp_path, monkeypatch, capfd
):
    """The model's files fill the disk halfway through their copy into the run's artifacts: the
    line says so and that the half-written files were removed; none stay, no version is
    registered, the run is FAILED (issue #62: an unregistered half-copied folder stayed)."""
    import mlflow
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    copied = []

    def half(self, local_dir, artifact_path=None):
        from pathlib import Path

        first = sorted(p for p in Path(local_dir).rglob("*") if p.is_file())[0]
        self.log_artifact(str(first), artifact_path)  # one file lands, then the disk is full
        copied.append(Path(self.artifact_dir))
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(self.artifact_dir) / "checkpoint"))

    monkeypatch.setattr(LocalArtifactRepository, "log_artifacts", half)
    code = main(["train", "--data", str(corpus), *TRAIN, "--workdir", str(tmp_path)])
    line, _ = _one_error_line(capfd)
    assert code == 2 and "out of space writing" in line, line
    assert "no model version was registered" in line and "half-written model files were removed" in line, line
    assert copied and not any(p.exists() for p in copied), copied
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = mlflow.search_runs(experiment_names=["mmlinks"], output_format="list")
    assert run.info.status == "FAILED"
    assert not mlflow.MlflowClient().search_registered_models()


def test_link_on_a_full_disk_ends_in_one_line(corpus, tmp_path, monkeypatch, capfd):
    import linking.steps

    wd = tmp_path / "wd"
    assert main(["train", "--data", str(corpus), *TRAIN, "--backbone", "bag", "--workdir", str(wd)]) == 0
    capfd.readouterr()
    real = linking.steps.fileio.write_bytes_atomic

    def full(path, data):
        if "shards" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(linking.steps.fileio, "write_bytes_atomic", full)
    out = tmp_path / "links"
    args = ["link", "--data", str(corpus), "--model", "models:/mmlinks-ap@candidate", "--out", str(out)]
    code = main([*args, "--workdir", str(wd), "--direct-workers", "1"])
    line, _ = _one_error_line(capfd)
    assert code == 2 and "out of space" in line
