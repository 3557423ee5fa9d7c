"""A real build through the CLI keeps library noise off the terminal (issue #19, hole 7).

Beam's SDK worker processes print GCS/apitools import failures, ``semi_persistent_directory``
and "Discarding unparseable args" on every build; they must land in the build's log file."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.cli.test_cli import MMLINKS

pytestmark = [pytest.mark.faults, pytest.mark.slow]

NOISE = (
    "Failed to import GCSFileSystem",
    "apitools",
    "semi_persistent_directory",
    "Discarding unparseable args",
    "Pipeline_options",
    "Logging handler created",
)


def test_build_stderr_has_only_what_the_user_must_read(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    synth = [MMLINKS, "data", "synth", "--out", str(tmp_path / "raw"), "--docs", "6", "--quiet"]
    subprocess.run(synth, check=True, capture_output=True, env=env, timeout=300)
    out = tmp_path / "ds"
    # two worker processes: the noise comes from Beam's SDK workers, not the main process
    cmd = [
        MMLINKS,
        "data",
        "build",
        "--input",
        str(tmp_path / "raw"),
        "--out",
        str(out),
        "--direct-workers",
        "2",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = [line for line in proc.stderr.splitlines() if any(n in line for n in NOISE)]
    assert found == [], found
    assert f"library logs: {out / 'build.log'}" in proc.stderr
    log = (out / "build.log").read_text()
    assert any(n in log for n in NOISE), log[-2000:]  # routed to the log file, not lost
    assert "documents per split" in proc.stdout  # the summary still reaches the user
