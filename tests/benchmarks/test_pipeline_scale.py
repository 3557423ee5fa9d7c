"""``benchmarks/pipeline_scale.py`` (issue #47): the process monitor keeps a worker's role to its
end (the 100K run first counted three exiting Ray read tasks, 742-879 MiB, as "other")."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import psutil

# by path: an installed dependency ships a top-level ``benchmarks`` package of its own
_SPEC = importlib.util.spec_from_file_location(
    "pipeline_scale", Path(__file__).resolve().parents[2] / "benchmarks" / "pipeline_scale.py"
)
pipeline_scale = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(pipeline_scale)


def test_role_is_read_from_the_command_line_and_unknown_once_the_process_is_gone():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)", "ray::RayTrainWorker"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # Popen returns before the child has exec'd; until then its command line is not the child's
        # (the suite under load read it empty once). The child's first line says it is running.
        assert child.stdout.readline().strip() == "up"
        proc = psutil.Process(child.pid)
        assert pipeline_scale.role(proc, top=-1) == "train_worker"
        assert pipeline_scale.role(psutil.Process(), top=psutil.Process().pid) == "driver"
        child.kill()
        child.wait()
        assert pipeline_scale.role(proc, top=-1) is None  # reaped: no command line to read
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_the_monitor_keeps_a_workers_role_and_peak_after_it_exits():
    """A parent whose child takes a Ray task title, grows, exits and stays unreaped a while (its
    command line reads empty then, as an exiting Ray worker's does once its memory is released)."""
    script = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', "
        "'b = bytearray(64 << 20); import time; time.sleep(1.5)', 'ray::ReadFiles'])\n"
        "time.sleep(3.0); c.wait()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    mon = pipeline_scale.TreeMonitor(parent.pid, poll_s=0.1)
    parent.wait()
    time.sleep(0.2)
    mem = mon.stop()
    tasks = mem["peak_rss_mib"].get("ray_task", [])
    assert tasks and max(tasks) >= 64, mem["peak_rss_mib"]
    assert all(v < 64 for v in mem["peak_rss_mib"].get("other", [])), mem["peak_rss_mib"]
