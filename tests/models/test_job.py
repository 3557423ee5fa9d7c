"""``python -m models.job``: a config file in, one JSON result line out, typed on the way back."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.errors import MmlinksError
from tests.conftest import small_train_config, tracking_uri
from training.experiment import ExperimentResult

ROOT = Path(__file__).resolve().parents[2]


def run_job(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "models.job", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_experiment_result_round_trips_through_its_dict_and_json():
    res = ExperimentResult(
        run_id="r1",
        model_uri="models:/m@candidate",
        model_version="3",
        best_epoch=2,
        test={"auc": 70.0},
        random={"auc": 50.0},
        tracking_uri="sqlite:///x.db",
        report_path="/tmp/r.html",
    )
    assert ExperimentResult.from_dict(res.to_dict()) == res
    assert ExperimentResult.from_json("ray: noise\n" + json.dumps(res.to_dict()) + "\n") == res
    with pytest.raises(MmlinksError, match="not an experiment result"):
        ExperimentResult.from_dict({"run_id": "r1"})
    with pytest.raises(MmlinksError, match="no JSON result line"):
        ExperimentResult.from_json("nothing here")


def test_a_submitted_config_with_an_unknown_key_is_refused_by_name(tmp_path):
    from models.job import load_config
    from training.config import TrainConfig

    with pytest.raises(
        MmlinksError,
        match=r"^unknown training config field\(s\) epoch \(did you mean epochs\?\) \(or is this mmlinks",
    ):
        load_config(json.dumps({"data": str(tmp_path), "epoch": 3}))  # a typo would train 20 epochs
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"data": str(tmp_path), "max_tokenz": 9, "zzz": 1}))
    with pytest.raises(
        MmlinksError,
        match=r"^unknown training config field\(s\) max_tokenz \(did you mean max_tokens\?\), zzz ",
    ):
        load_config(str(path))
    cfg = TrainConfig(data=str(tmp_path), epochs=3)
    for written in (cfg.to_dict(), cfg.public_dict()):  # what a submitter and a run record write
        assert load_config(json.dumps(written)).epochs == 3
    # a saved config of an older version is still read: a field since removed is dropped
    assert TrainConfig.from_dict({**cfg.to_dict(), "retired_option": 1}).epochs == 3


@pytest.mark.slow
def test_a_bad_config_fails_with_one_error_line(tmp_path):
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"data": str(tmp_path), "objective": "nope"}))
    proc = run_job("--config", str(cfg), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "mmlinks: error: invalid training config: objective" in proc.stderr


@pytest.mark.slow
def test_the_job_trains_and_prints_a_typed_result(dataset, tmp_path, ray_local):
    import ray

    # As a Ray job's driver does, the job joins a running cluster (here the session's) by address.
    address = ray.get_runtime_context().gcs_address
    # The job entry point is what this tests: its training runs in the job's process (--workers 0).
    cfg = small_train_config(dataset, tmp_path / "ray", epochs=1, run_name="", ray_address=address)
    path = tmp_path / "train.json"
    path.write_text(json.dumps(cfg.to_dict()))
    uri = tracking_uri(tmp_path)
    proc = run_job(
        "--config",
        str(path),
        "--tracking-uri",
        uri,
        "--model-name",
        "job-test",
        "--report-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = proc.stdout.strip().splitlines()  # stdout holds the result line and nothing else
    res = ExperimentResult.from_json(line)
    assert res.model_uri == "models:/job-test@candidate" and res.model_version == "1"
    assert res.tracking_uri == uri and res.best_epoch == 0
    assert 0 <= res.test["auc"] <= 100 and Path(res.report_path).is_file()
