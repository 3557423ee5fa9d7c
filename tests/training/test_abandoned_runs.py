"""A command resuming a training run ends the MLflow runs its killed predecessors left RUNNING
(``training.tracking.close_abandoned_runs``), against a real SQLite tracking store. The real kill
is ``tests/faults/test_train_faults.py::test_driver_killed_mid_run_resumes_to_the_uninterrupted_result``."""

import os
import platform
import subprocess
import sys

from mlflow.tracking import MlflowClient

from tests.conftest import tracking_uri
from training.run_inputs import resume_key
from training.tracking import DRIVER_TAGS, RESUME_KEY_TAG, close_abandoned_runs, configure


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_resuming_marks_only_dead_commands_of_the_same_run_killed(tmp_path):
    uri = tracking_uri(tmp_path)
    client = MlflowClient(uri)
    exp = configure(uri, "mmlinks")
    key, other = resume_key("r", str(tmp_path / "ray")), resume_key("r", str(tmp_path / "elsewhere"))
    assert key != other and str(tmp_path) not in key  # the storage path is hashed, never logged

    def run(k: str, pid: int, host: str = platform.node()):
        return client.create_run(
            exp, tags={RESUME_KEY_TAG: k, DRIVER_TAGS[0]: host, DRIVER_TAGS[1]: str(pid)}
        )

    dead, remote = run(key, _dead_pid()), run(key, 1, host="another-node")
    alive = run(key, os.getppid())  # a live process on this machine: its command is still training
    finished, unrelated = run(key, _dead_pid()), run(other, _dead_pid())
    client.set_terminated(finished.info.run_id, "FINISHED")
    new = run(key, _dead_pid())

    ended = close_abandoned_runs(client, new, key)

    assert sorted(ended) == sorted([dead.info.run_id, remote.info.run_id])
    status = {r: client.get_run(r.info.run_id) for r in (dead, remote, alive, finished, unrelated, new)}
    assert [status[r].info.status for r in (dead, remote)] == ["KILLED", "KILLED"]
    assert all(status[r].data.tags["mmlinks.resumed_by"] == new.info.run_id for r in (dead, remote))
    # a driver still alive on this machine, an ended run and another storage's run are left alone
    assert [status[r].info.status for r in (alive, finished, unrelated, new)] == [
        "RUNNING", "FINISHED", "RUNNING", "RUNNING"
    ]  # fmt: skip
    assert sorted(status[new].data.tags["mmlinks.resumes"].split(",")) == sorted(ended)
    assert close_abandoned_runs(client, new, key) == []  # nothing left to end


def test_a_run_name_with_quotes_and_spaces_still_finds_its_predecessors(tmp_path):
    uri = tracking_uri(tmp_path)
    client = MlflowClient(uri)
    exp = configure(uri, "mmlinks")
    key = resume_key("bob's run \\ 2", str(tmp_path / "ray"))
    assert key != resume_key("bob_s run _ 2", str(tmp_path / "ray"))  # the hash tells them apart
    tags = {RESUME_KEY_TAG: key, DRIVER_TAGS[0]: platform.node(), DRIVER_TAGS[1]: str(_dead_pid())}
    dead, new = client.create_run(exp, tags=tags), client.create_run(exp, tags=tags)
    assert close_abandoned_runs(client, new, key) == [dead.info.run_id]
