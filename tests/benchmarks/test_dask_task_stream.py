"""``benchmarks/dask_task_stream.py`` (issue #47): the scheduler preload records every task's
compute span on a real cluster; the summary's windows add up to each worker's compute time."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dask_task_stream.py"
# by path: an installed dependency ships a top-level ``benchmarks`` package of its own
_SPEC = importlib.util.spec_from_file_location("dask_task_stream", SCRIPT)
dask_task_stream = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(dask_task_stream)


def _nap(part):
    time.sleep(0.2)
    return part


def test_a_clusters_tasks_are_recorded_by_stage_with_their_compute_time(tmp_path, monkeypatch):
    import json
    import logging

    import dask.bag as db
    from dask.distributed import Client, LocalCluster

    out = tmp_path / "ts.json"
    monkeypatch.setenv(dask_task_stream.OUT_ENV, str(out))
    cluster = LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        dashboard_address=None,
        silence_logs=logging.ERROR,
        scheduler_kwargs={"preload": [str(SCRIPT)]},
    )
    try:
        with Client(cluster) as client:
            bag = db.from_sequence(range(6), npartitions=3).map_partitions(_nap)
            # as the Dask runner computes: graph optimisation would fuse and rename the tasks
            assert sorted(client.compute(bag, optimize_graph=False).result()) == list(range(6))
    finally:
        cluster.close()
    got = dask_task_stream.summarise(json.loads(out.read_text()), window=0.25)
    nap = got["stages"]["_nap"]
    assert nap["tasks"] == 3 and 0.6 <= nap["compute_s"] < 1.5, nap
    assert nap["fetch_s"] == 0.0  # one worker: nothing fetched from another
    assert len(got["workers"]) == 1
    assert max(w["busy"][0] for w in got["windows"]) > 0.5


def test_stage_names_come_from_tuple_and_plain_keys():
    h = "0123456789abcdef" * 2
    assert dask_task_stream.stage_of(f"('Read+Validate-{h}', 3)") == "Read+Validate"
    assert dask_task_stream.stage_of(f"side-input-{h}") == "side-input"
    assert dask_task_stream.stage_of("finalize") == "finalize"


@settings(max_examples=100, deadline=None)
@given(
    tasks=st.lists(
        st.tuples(st.integers(0, 2), st.floats(0, 100), st.floats(0.01, 40)), min_size=1, max_size=30
    ),
    window=st.floats(0.5, 30),
)
def test_each_workers_windows_add_up_to_its_compute_time(tasks, window):
    """Against a plain sum: a worker's busy fractions times the window are its total compute."""
    records = [
        [f"('stage{i % 3}-{'0' * 32}', {i})", f"tcp://w{w}", [[start, start + length]]]
        for i, (w, start, length) in enumerate(tasks)
    ]
    got = dask_task_stream.summarise(records, window)
    assert sum(s["tasks"] for s in got["stages"].values()) == len(tasks)
    for i, worker in enumerate(got["workers"]):
        total = sum(length for w, _, length in tasks if f"tcp://w{w}" == worker)
        busy = sum(x["busy"][i] for x in got["windows"]) * window
        assert abs(busy - total) <= 0.005 * window * len(got["windows"]) + 1e-6  # rounded to 0.01 a window


def test_a_missing_empty_or_damaged_stream_is_a_one_line_error(tmp_path):
    import subprocess
    import sys

    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "bad.json").write_text("[[")
    cases = (("missing.json", "cannot read"), ("bad.json", "cannot read"), ("empty.json", "no tasks"))
    for name, says in cases:
        cmd = [sys.executable, str(SCRIPT), str(tmp_path / name)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode != 0 and says in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
