"""Two `mmlinks promote` processes of one model at once (issue #46): promotions are serialised,
as the README says. The loser waits for the lock instead of being refused with the bad-input
exit code; the winner prints what a person reads (no raw dict, no "(was None)"); a promotion
that cannot get the lock within its wait exits 75 with a "run it again" hint.

The race is made certain, not left to timing: this test holds the promotion lock while both
processes evaluate, and releases it once both say they are waiting for it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from models.registry import CANDIDATE, PRODUCTION, PromotionLock
from tests.linking.conftest import register_model
from training.tracking import tracking_uri

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NAME = "promotion-race"


def _promote(dataset: Path, workdir: Path, *extra: str) -> subprocess.Popen:
    args = ["promote", "--data", str(dataset), "--model-name", NAME, "--workdir", str(workdir), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=workdir,
        env={**env, "PYTHONPATH": str(ROOT)},
    )


def test_two_concurrent_promotions_are_serialised(dataset, tmp_path, fault_stats):
    workdir = tmp_path / "w"
    workdir.mkdir()
    version = register_model(workdir, dataset, seed=0, alias=CANDIDATE, name=NAME)
    client = MlflowClient(tracking_uri(workdir))
    lock = PromotionLock(client, NAME)
    lock.__enter__()  # held by "another promotion" until both processes wait for it
    procs = [_promote(dataset, workdir) for _ in range(2)]
    stderr: list[list[str]] = [[], []]
    waiting = [threading.Event(), threading.Event()]

    def read(k: int) -> None:
        for line in procs[k].stderr:
            stderr[k].append(line.rstrip("\n"))
            if line.startswith("waiting up to"):
                waiting[k].set()
        waiting[k].set()  # it ended without waiting: the assertion below says so

    readers = [threading.Thread(target=read, args=(k,), daemon=True) for k in range(2)]
    for r in readers:
        r.start()
    try:
        for k in range(2):  # both evaluated and now wait for the lock (not refused)
            waiting[k].wait(600)
            assert any(line.startswith("waiting up to") for line in stderr[k]), stderr[k]
        # one more, unwilling to wait: the distinct exit code and the hint
        impatient = _promote(dataset, workdir, "--lock-wait-s", "0")
        _, err = impatient.communicate(timeout=600)
        assert impatient.returncode == 75, err
        assert err.strip().splitlines()[-1].startswith("mmlinks: error: another promotion")
        assert "run the same command again" in err
    finally:
        lock.__exit__(None, None, None)
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for r in readers:
        r.join(timeout=10)
    fault_stats.add(faults_injected=1)
    assert [p.returncode for p in procs] == [0, 0], (outs, stderr)
    won = [o for o in outs if "production -> version" in o]
    assert len(won) == 1, outs
    assert f"production -> version {version} (the first production version)" in won[0], won
    assert "{" not in won[0] and "None" not in won[0], won  # human text, not a dict
    assert "candidate:  AUC " in won[0], won
    lost = next(o for o in outs if o is not won[0])
    assert f"version {version} is already production" in lost and "nothing changed" in lost, lost
    assert str(client.get_model_version_by_alias(NAME, PRODUCTION).version) == version
    assert len(client.search_model_versions(f"name='{NAME}'")) == 1
    fault_stats.add(invariant_checks=5)
