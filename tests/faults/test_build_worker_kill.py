"""A Beam worker process SIGKILLed under the multi-process DirectRunner at each point a worker
reaches, then the build run again: the fault-free build's bytes, every input kept or
dead-lettered (issue #19).

The build runs in a child process with two worker processes (``direct_workers=2``, i.e.
``--direct_running_mode=multi_processing``); ``pipelines/fault_hooks.py`` SIGKILLs the first
worker that reaches the stage (``$MMLINKS_TEST_KILL_ONCE`` lets only one die), so the driver
survives the kill and must notice it. The stages are the workers': an image fetched into the
store, a feature vector cached (inference), a shard staged. The manifest commit runs in the
driver after the pipeline, so no worker can die there: ``test_build_kills.py`` kills the driver
at every stage, the commit included.
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
from pipelines.commit import last_build
from pipelines.fault_hooks import KILL_BUILD_AT_ENV, KILL_ONCE_ENV
from schemas.manifest import MANIFEST_NAME, Manifest
from tests.conftest import add_bad_records, dead_letters, venv_env
from tests.faults.conftest import tiny_cfg
from tests.faults.test_build_kills import shard_bytes
from tests.faults.test_train_faults import TAG, leftovers
from tests.faults.test_web_faults import _reset_mid_body
from tests.pipelines.test_http_client import fresh_gates, serve  # noqa: F401

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


WORKER_STAGES = ("fetch", "features", "write")


def kill_a_worker_at(stage: str, corpus: Path, out: Path, tmp_path: Path) -> str:
    """Run the build in a child process whose first worker to reach ``stage`` is SIGKILLed;
    check that the driver failed the build in one line and no worker outlived it; its stderr."""
    marker, tag = tmp_path / f"killed-worker-{stage}", uuid.uuid4().hex
    env = venv_env(
        **{KILL_BUILD_AT_ENV: stage, KILL_ONCE_ENV: str(marker), TAG: tag, "PYTHONPATH": str(ROOT)}
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(corpus), str(out)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, start_new_session=True,
    )  # fmt: skip
    assert marker.read_text().isdigit(), stage  # one worker process died (it wrote its pid)
    assert proc.returncode not in (0, -9), proc.stderr[-3000:]  # the driver lived and failed the build
    # the build raised an MmlinksError: the CLI prints it as this one line (`mmlinks: error: ...`)
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("schemas.errors.MmlinksError: ")]
    assert said and said[-1].startswith("schemas.errors.MmlinksError: a Beam worker process died"), (
        proc.stderr[-3000:]
    )
    last = said[-1]
    assert "run the same build again" in last, last
    assert not leftovers(tag, wait_s=30), f"a worker outlived its build killed at {stage}"
    return last


def test_a_beam_worker_killed_at_each_stage_fails_the_build_and_the_rerun_gives_the_same_bytes(
    bad_tiny, tiny, tmp_path, fault_stats
):
    """One output folder, holding a current version (the clean tiny corpus's), takes a worker
    kill at fetch, then (rerun) at features, then at write, then the build runs to the end.

    Each killed build still has work left at its stage because the one before it died at the
    first item of an earlier stage; the current version stays readable throughout.
    """
    corpus, reference = bad_tiny
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(tiny[1] / MANIFEST_NAME, out / MANIFEST_NAME)  # a current version, not its store
    shutil.copytree(tiny[1] / "versions", out / "versions")
    current, current_shards = (out / MANIFEST_NAME).read_bytes(), shard_bytes(out)
    for stage in WORKER_STAGES:
        last = kill_a_worker_at(stage, corpus, out, tmp_path)
        fault_stats.add(faults_injected=1)
        assert Manifest.read(out).dataset_version in last  # the line names the version that stays
        assert (out / MANIFEST_NAME).read_bytes() == current, stage  # nothing committed
        assert shard_bytes(out) == current_shards, stage  # the current version is untouched
        fault_stats.add(invariant_checks=6)

    m = build_dataset(tiny_cfg(corpus, out, direct_workers=2))  # the same build, run again
    log, total = last_build(str(out)), last_build(str(reference))["features_computed"]
    assert log["features_cached"] + log["features_computed"] == total  # nothing computed twice
    assert m.to_json() == Manifest.read(reference).to_json()
    assert shard_bytes(out) == shard_bytes(reference)
    assert (out / m.dead_letter).read_bytes() == (reference / m.dead_letter).read_bytes()
    assert not list(out.glob(".staging-*"))
    assert sorted(p.name for p in (out / "versions").iterdir()) == sorted(
        {m.dataset_version, Manifest.read(tiny[1]).dataset_version}
    )  # the new version and the one it replaced, no stray folder of a killed build
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
    fault_stats.add(invariant_checks=8)


def test_a_lost_worker_is_recognised_through_beams_wrapping():
    from pipelines.build import worker_lost

    try:
        try:
            raise RuntimeError("Channel closed prematurely.")
        except RuntimeError as inner:
            raise ValueError("Pipeline failed in stage ref_AppliedPTransform_Features") from inner
    except ValueError as outer:
        assert worker_lost(outer) == "RuntimeError: Channel closed prematurely"
    assert worker_lost(RuntimeError("bad input")) is None
    assert worker_lost(OSError(28, "No space left on device")) is None


def _fetch(url: str) -> bytes:
    """A source's fetch that lets its error go (no retry): the polite client, as the sources use it."""
    from urllib.parse import urlsplit

    from pipelines.web import PoliteClient
    from pipelines.web.policy import HttpPolicy

    host = urlsplit(url).netloc
    policy = HttpPolicy(frozenset({host}), rate_per_host=None, max_retries=0, allow_private=True, timeout=5.0)
    return PoliteClient(policy).get(url).body


def test_an_http_connection_reset_in_a_fetch_is_not_a_lost_worker(serve, fault_stats):  # noqa: F811
    """A loopback server resets the connection mid-body; the fetch runs in a Beam step whose error
    fails the pipeline. Its text says "Connection reset by peer" (the words the old pattern took
    for a lost worker), but no worker died: the build must raise the fetch error itself."""
    import apache_beam as beam

    from pipelines.build import worker_lost
    from pipelines.direct_runner import DirectRunner

    server = serve(_reset_mid_body)
    with pytest.raises(Exception) as err:
        with beam.Pipeline(runner=DirectRunner()) as p:
            _ = p | beam.Create([server.url("/a.jpg")]) | beam.Map(_fetch)
    chain, exc = [], err.value
    while exc is not None:
        chain.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    assert "Connection reset by peer" in " ".join(chain), chain  # the fault was the HTTP reset
    assert worker_lost(err.value) is None, chain
    fault_stats.add(faults_injected=1, invariant_checks=1)


def test_a_grpc_peer_reset_is_a_lost_worker():
    """What the runner's gRPC channel says when the worker at its other end is gone: a real call
    to a loopback peer that resets the connection (SO_LINGER 0) fails UNAVAILABLE."""
    import socket
    import threading

    import grpc

    from pipelines.build import worker_lost

    listener = socket.create_server(("127.0.0.1", 0))

    def reset_every_connection():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            conn.recv(100)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()

    threading.Thread(target=reset_every_connection, daemon=True).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{listener.getsockname()[1]}")
    try:
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary("/beam.Fn/Control")(b"", timeout=10)
    finally:
        channel.close()
        listener.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    found = worker_lost(err.value)
    assert found is not None and found.startswith(f"{type(err.value).__name__}: gRPC UNAVAILABLE: "), found
    assert "\n" not in found
