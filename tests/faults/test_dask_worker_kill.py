"""A Dask worker process SIGKILLed mid-build (``--runner dask`` on a local cluster of two worker
processes), then the build run again: the fault-free build's bytes (issue #35).

The build runs in a child process that starts its own cluster; ``pipelines/fault_hooks.py``
SIGKILLs the first worker to cache a feature vector (``$MMLINKS_TEST_KILL_ONCE``: one dies). The
scheduler re-runs a dead worker's tasks on the live one (its nanny restarts the dead one), so by
default the build goes on and commits the fault-free bytes itself: the counters of the killed
attempt never reached the driver, so the counts are still exact. With Dask's allowed failures
at 0 (``DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES``) the lost task fails the job: one line
naming Dask's ``KilledWorker``, nothing committed, and the rerun commits the same bytes.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pipelines.build import build_dataset
from pipelines.commit import last_build
from pipelines.fault_hooks import KILL_BUILD_AT_ENV, KILL_ONCE_ENV
from schemas.manifest import MANIFEST_NAME, Manifest
from tests.conftest import venv_env
from tests.faults.conftest import tiny_cfg
from tests.faults.test_build_kills import shard_bytes
from tests.faults.test_build_worker_kill import bad_tiny  # noqa: F401
from tests.faults.test_train_faults import TAG, leftovers

# Three builds each, a cluster start per build: 10-15 min on the shared 2-core machine under load
pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
DASK = {"runner": "dask", "dask_workers": 2, "direct_workers": None}
CHILD = """
import sys
from pipelines.build import build_dataset
from tests.faults.conftest import tiny_cfg
build_dataset(tiny_cfg(sys.argv[1], sys.argv[2], runner="dask", dask_workers=2, direct_workers=None))
"""


def build_killing_a_worker(
    corpus: Path, out: Path, tmp_path: Path, **env: str
) -> subprocess.CompletedProcess:
    marker, tag = tmp_path / f"killed-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    env = venv_env(
        **{KILL_BUILD_AT_ENV: "features", KILL_ONCE_ENV: str(marker), TAG: tag, "PYTHONPATH": str(ROOT)},
        **env,
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(corpus), str(out)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900, start_new_session=True,
    )  # fmt: skip
    assert marker.read_text().isdigit(), proc.stderr[-3000:]  # a worker process died (its pid)
    assert proc.returncode != -9, proc.stderr[-3000:]  # not the driver
    assert not leftovers(tag, wait_s=30), "a Dask worker outlived its build"
    return proc


def assert_reference_bytes(out: Path, reference: Path) -> None:
    m = Manifest.read(out)
    assert (out / MANIFEST_NAME).read_bytes() == (reference / MANIFEST_NAME).read_bytes()
    assert shard_bytes(out) == shard_bytes(reference)
    assert (out / m.dead_letter).read_bytes() == (reference / m.dead_letter).read_bytes()
    assert not list(out.glob(".staging-*"))


def test_a_dask_worker_killed_mid_build_is_replaced_and_the_build_commits_the_fault_free_bytes(
    bad_tiny,  # noqa: F811
    tmp_path,
    fault_stats,
):
    corpus, reference = bad_tiny
    out = tmp_path / "out"
    proc = build_killing_a_worker(corpus, out, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]  # the scheduler re-ran the lost tasks
    assert_reference_bytes(out, reference)  # counts included: the killed attempt's never arrived
    build_dataset(tiny_cfg(corpus, out, **DASK))  # the rerun: the same version again
    assert_reference_bytes(out, reference)
    assert last_build(str(out))["features_computed"] == 0  # every feature cached by the first run
    fault_stats.add(faults_injected=1, invariant_checks=9)


def test_with_no_allowed_failures_a_killed_worker_fails_the_build_in_one_line_and_the_rerun_recovers(
    bad_tiny,  # noqa: F811
    tmp_path,
    fault_stats,
):
    corpus, reference = bad_tiny
    out = tmp_path / "out"
    proc = build_killing_a_worker(corpus, out, tmp_path, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="0")
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("schemas.errors.MmlinksError: ")]
    assert proc.returncode != 0 and said, proc.stderr[-3000:]
    assert said[-1].startswith("schemas.errors.MmlinksError: a Beam worker process died during the build ")
    assert "KilledWorker" in said[-1] and "nothing was committed" in said[-1], said[-1]
    assert not (out / MANIFEST_NAME).exists()
    build_dataset(tiny_cfg(corpus, out, **DASK))
    assert_reference_bytes(out, reference)
    fault_stats.add(faults_injected=1, invariant_checks=8)
