"""The same `mmlinks train --run-name` command run again (issue #46), as a retried pipeline step
does: once the run has finished it says so and registers nothing (it used to train 0 epochs and
register a copy as a new version, moving `candidate` to it); a run that stopped after a
checkpoint says from which epoch it goes on. The real command in its own process, MLflow in a
SQLite file, the tiny corpus trained in-process (``--workers 0``) with Ray Data on the session's
Ray (``--ray-address``: three Ray starts on a loaded machine miss Ray's own 30 s start timeout)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import venv_env
from training.checkpoints import local_checkpoints

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "--epochs", "2", "--d-multi", "16", "--workers", "0", "--min-word-count", "1",
    "--batch-docs", "2", "--select-by", "val_loss", "--run-name", "r",
    "--image-centring", "none",  # the fixture's side: no image-side trials (issue #60)
]  # fmt: skip
MODEL = "mmlinks-ap"


def _train(data: Path, work: Path, *extra: str) -> subprocess.CompletedProcess:
    """The command, run from an empty folder of its own (nothing may land there); once more if
    Ray's own start timed out (a fixed 30 s a loaded machine can miss, as run_train says)."""
    import ray

    cmd = [sys.executable, "-m", "cli", "train", "--data", str(data), "--storage-path", str(work / "ray")]
    cmd += ["--ray-address", ray.get_runtime_context().gcs_address]
    cwd = work.parent / "cwd"
    cwd.mkdir(exist_ok=True)
    for attempt in range(2):
        proc = subprocess.run(
            [*cmd, "--workdir", str(work), *ARGS, *extra],
            env=venv_env(PYTHONPATH=str(ROOT)),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode == 0 or attempt or "timed out during startup" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert list(cwd.iterdir()) == []  # reports and artifacts go under --workdir
    return proc


def test_a_finished_run_is_not_registered_again_and_a_resumed_one_says_its_epoch(
    tiny_train, tmp_path, ray_local
):
    work = tmp_path / "w"
    work.mkdir()
    first = json.loads(_train(tiny_train, work, "--json").stdout.strip().splitlines()[-1])
    assert first["model_version"] == "1" and not first["already_finished"]
    assert first["report"] == str(work / "reports" / f"{first['run_id']}.html")
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")

    again = _train(tiny_train, work)
    assert "this training run already finished" in again.stdout, again.stdout
    assert "no model version was registered" in again.stdout and first["run_id"] in again.stdout
    assert "resuming" not in again.stderr
    assert [str(v.version) for v in client.search_model_versions(f"name='{MODEL}'")] == ["1"]  # no copy
    assert str(client.get_model_version_by_alias(MODEL, "candidate").version) == "1"

    # The same run stopped after epoch 0's checkpoint (killed: its MLflow run never finished).
    client.set_terminated(first["run_id"], "KILLED")
    run_dir = work / "ray" / "r"
    for folder, metrics in local_checkpoints(run_dir):
        if metrics["epoch"] == 1:
            shutil.rmtree(folder)
    resumed = _train(tiny_train, work, "--json")
    assert "resuming training run 'r' from its checkpoint of epoch 0: epoch 1 left" in resumed.stderr
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["model_version"] == "2" and not result["already_finished"]
