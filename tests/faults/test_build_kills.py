"""A dataset build SIGKILLed at each stage, then run again, gives the fault-free build's bytes
(issue #19).

The kill is real: the build runs in a child process (in-process DirectRunner, so the child is
the driver and the only worker) with ``$MMLINKS_TEST_KILL_BUILD_AT`` set, and
``pipelines/fault_hooks.py`` SIGKILLs it the first time it reaches the stage, so no timer races
the build. The rerun runs in the test process and must resume (images from the store, features
from the cache) and commit the very manifest and shard bytes of an uninterrupted build.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.build import build_dataset
from pipelines.commit import last_build
from pipelines.fault_hooks import KILL_BUILD_AT_ENV, STAGES
from schemas.manifest import MANIFEST_NAME, Manifest
from tests.conftest import venv_env
from tests.faults.conftest import tiny_cfg

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# What the test process and the killed child both build: a tiny corpus, in-process DirectRunner.
CHILD = """
import sys
from pipelines.build import build_dataset
from tests.faults.conftest import tiny_cfg
build_dataset(tiny_cfg(sys.argv[1], sys.argv[2]))
"""


def shard_bytes(out: Path) -> dict[str, bytes]:
    m = Manifest.read(out)
    return {s.path: (out / s.path).read_bytes() for s in m.shards}


def kill_build_at(stage: str, corpus: Path, out: Path) -> None:
    """Run the tiny build in a child process that SIGKILLs itself at ``stage``. Its temporary
    folder is the test's: a SIGKILL skips the cleanup of the one Beam makes for each pipeline."""
    tmp = out.parent / "child-tmp"
    tmp.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(corpus), str(out)],
        env=venv_env(**{KILL_BUILD_AT_ENV: stage, "TMPDIR": str(tmp)}),
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]


def test_a_build_killed_at_every_stage_in_turn_reruns_to_the_same_bytes(tiny, tmp_path, fault_stats):
    """Kill at read, then (rerun) at fetch, features, write and commit, then let it finish.

    One output folder takes all five kills in turn (cheaper than five folders, and harder: each
    rerun starts from the previous dead builds' leftovers); each killed build still has work left
    at its stage because the one before it died at the first item of an earlier stage.
    """
    corpus, reference = tiny
    out = tmp_path / "out"
    for stage in STAGES:
        kill_build_at(stage, corpus, out)
        fault_stats.add(faults_injected=1)
        assert not (out / MANIFEST_NAME).exists(), stage  # nothing committed: no version to read
        if stage == "commit":  # killed between moving the shards and writing the manifest
            assert list((out / "versions").glob("*/*.parquet"))
    assert len(list(out.glob(".staging-*"))) == 1  # the last killed build's (each removes the one before)

    m = build_dataset(tiny_cfg(corpus, out))
    log = last_build(str(out))
    assert log["features_computed"] == 0 and log["features_cached"] > 0  # resumed, nothing redone
    assert log["images_fetched"] == 0 and log["images_from_store"] > 0
    assert m.to_json() == Manifest.read(reference).to_json()
    assert shard_bytes(out) == shard_bytes(reference)
    assert (out / m.dead_letter).read_bytes() == (reference / m.dead_letter).read_bytes()
    assert not list(out.glob(".staging-*"))  # the dead builds' staging folders are gone
    assert [p.name for p in (out / "versions").iterdir()] == [m.dataset_version]
    fault_stats.add(invariant_checks=len(STAGES) + 4)
