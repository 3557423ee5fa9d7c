"""A Beam worker process SIGKILLed under the multi-process DirectRunner, then the build run
again: the fault-free build's bytes, every input kept or dead-lettered (issue #19).

The build runs in a child process with two worker processes (``direct_workers=2``, i.e.
``--direct_running_mode=multi_processing``); ``pipelines/fault_hooks.py`` SIGKILLs the first
worker that computes a feature vector (``$MMLINKS_TEST_KILL_ONCE`` lets only one die), so the
driver survives the kill and must notice it. ``test_build_kills.py`` kills the driver instead.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from pipelines.build import build_dataset
from pipelines.commit import dead_letters, last_build
from pipelines.fault_hooks import KILL_BUILD_AT_ENV, KILL_ONCE_ENV
from schemas.manifest import MANIFEST_NAME, Manifest
from tests.conftest import add_bad_records, venv_env
from tests.faults.conftest import tiny_cfg
from tests.faults.test_build_kills import shard_bytes
from tests.faults.test_train_faults import TAG, leftovers

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import sys
from pipelines.build import build_dataset
from tests.faults.conftest import tiny_cfg
build_dataset(tiny_cfg(sys.argv[1], sys.argv[2], direct_workers=2))
"""


@pytest.fixture(scope="module")
def bad_tiny(tiny, tmp_path_factory):
    """(corpus, reference): the tiny corpus plus the suite's planted bad records (malformed lines,
    undecodable images, near-duplicates: something to dead-letter) and its fault-free build."""
    root = tmp_path_factory.mktemp("bad-tiny")
    shutil.copytree(tiny[0], root / "corpus")
    add_bad_records(root / "corpus")
    build_dataset(tiny_cfg(root / "corpus", root / "reference"))
    return root / "corpus", root / "reference"


def test_a_killed_beam_worker_fails_the_build_and_the_rerun_gives_the_same_bytes(
    bad_tiny, tmp_path, fault_stats
):
    corpus, reference = bad_tiny
    out, marker, tag = tmp_path / "out", tmp_path / "killed-worker", uuid.uuid4().hex
    env = venv_env(
        **{KILL_BUILD_AT_ENV: "features", KILL_ONCE_ENV: str(marker), TAG: tag, "PYTHONPATH": str(ROOT)}
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(corpus), str(out)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, start_new_session=True,
    )  # fmt: skip
    assert marker.read_text().isdigit()  # one worker process died (it wrote its pid)
    fault_stats.add(faults_injected=1)
    assert proc.returncode not in (0, -9), proc.stderr[-3000:]  # the driver lived and failed the build
    assert not (out / MANIFEST_NAME).exists()  # the driver failed the build: nothing committed
    assert not leftovers(tag, wait_s=30), "the other worker outlived its build"

    m = build_dataset(tiny_cfg(corpus, out, direct_workers=2))  # the same build, run again
    log, total = last_build(str(out)), last_build(str(reference))["features_computed"]
    assert log["features_cached"] + log["features_computed"] == total  # nothing computed twice
    assert m.to_json() == Manifest.read(reference).to_json()
    assert shard_bytes(out) == shard_bytes(reference)
    assert (out / m.dead_letter).read_bytes() == (reference / m.dead_letter).read_bytes()
    assert not list(out.glob(".staging-*"))
    # Every input line is kept in a split or dead-lettered with a reason, none lost to the dead worker.
    lines = len((corpus / "documents.jsonl").read_bytes().splitlines())
    dropped = m.counts["dropped"]
    assert m.counts["pipeline"]["lines_in"] == lines
    assert (
        sum(m.counts["splits"].values())
        + sum(v for k, v in dropped.items() if k.startswith(("document:", "line:")))
        == lines
    )
    assert dict(Counter(f"{r['kind']}:{r['reason']}" for r in dead_letters(out))) == dropped
    fault_stats.add(invariant_checks=9)
