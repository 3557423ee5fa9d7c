"""`mmlinks link` on a dataset damaged after its commit (issue #46): a flipped byte (the file
still parses, with other values), a truncated and a missing shard are each refused with one
`mmlinks: error:` line naming the shard, before the Beam graph starts, and leave no output
folder behind; a job that fails inside the graph removes the output folder it made."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from linking.config import LinkConfig
from linking.job import link_documents
from schemas.manifest import Manifest
from tests.linking.conftest import NAME

pytestmark = [pytest.mark.slow, pytest.mark.faults]

PRODUCTION = f"models:/{NAME}@production"
ROOT = Path(__file__).resolve().parents[2]


def _damaged(dataset: Path, to: Path, damage: str) -> tuple[Path, Path]:
    """A copy of ``dataset`` with its first test shard damaged; (copy, that shard)."""
    shutil.copytree(dataset, to)
    shard = Manifest.read(to).shard_paths(to, "test")[0]
    body = bytearray(shard.read_bytes())
    if damage == "flip":
        body[len(body) // 2] ^= 0x01  # same size, one bit inside a data page
        shard.write_bytes(bytes(body))
    elif damage == "truncate":
        shard.write_bytes(bytes(body[: len(body) - 100]))
    else:
        shard.unlink()
    return to, shard


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_link_refuses_a_damaged_shard_in_one_line(dataset, link_workdir, tmp_path, capsys, damage):
    data, shard = _damaged(dataset, tmp_path / "ds", damage)
    out = tmp_path / "out"
    args = ["link", "--data", str(data), "--model", PRODUCTION, "--out", str(out), "--split", "test"]
    assert main([*args, "--workdir", str(link_workdir), "--direct-workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("mmlinks: error:")]
    assert len(errors) == 1 and shard.name in errors[0], err
    assert "Traceback" not in "\n".join(err)
    assert not out.exists()  # refused before the output folder was made


def test_link_on_a_truncated_shard_prints_one_line_through_the_real_cli(dataset, link_workdir, tmp_path):
    """The installed entry point in its own process: the terminal gets the line, no traceback."""
    data, shard = _damaged(dataset, tmp_path / "ds", "truncate")
    out = tmp_path / "out"
    args = ["link", "--data", str(data), "--model", PRODUCTION, "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "cli", *args, "--workdir", str(link_workdir)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert sum(line.startswith("mmlinks: error:") for line in lines) == 1, lines
    assert shard.name in lines[-1] and "Traceback" not in proc.stderr, lines
    ours = ("linking ", "beam link: ", "mmlinks: error:")  # what it says, its heartbeat, the error
    assert [line for line in lines if not line.startswith(ours)] == [], lines  # no library output
    assert not out.exists() and proc.stdout == ""


def test_a_job_failing_inside_the_graph_leaves_no_output_folder(dataset, link_workdir, tmp_path):
    """A shard the manifest carries no checksum for (nothing to verify up front) that cannot be
    read: the job fails in the graph, and the output folder it made is gone with its staging."""
    data, _ = _damaged(dataset, tmp_path / "ds", "truncate")
    manifest = json.loads((data / "manifest.json").read_text())
    for s in manifest["shards"]:
        s["sha256"] = ""
    (data / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out"
    cfg = LinkConfig(
        model=PRODUCTION,
        out=str(out),
        data=str(data),
        split="test",
        direct_workers=1,
        workdir=str(link_workdir),
    )
    with pytest.raises(Exception):  # noqa: B017 - whatever pyarrow raises for the cut file
        link_documents(cfg)
    assert not out.exists()


def test_link_keeps_library_output_off_the_terminal_and_nothing_in_the_current_folder(
    dataset, link_workdir, tmp_path
):
    """A successful `mmlinks link` in its own process with two Beam worker processes (the suite's
    default is one, in-process: ``$MMLINKS_DIRECT_WORKERS``): the terminal gets what mmlinks says;
    the workers' INFO/WARNING lines (~40 on the terminal before) go to WORKDIR/link.log, as the
    build's go to its build.log; nothing lands in the current folder."""
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    args = ["link", "--data", str(dataset), "--model", PRODUCTION, "--out", str(out), "--split", "test"]
    args += ["--direct-workers", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "cli", *args, "--workdir", str(link_workdir)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert [line for line in lines if not line.startswith(("linking ", "beam link: "))] == [], lines
    assert f"(library logs: {link_workdir / 'link.log'})" in lines[0]
    assert "documents linked" in proc.stdout and (out / "manifest.json").exists()
    log = (link_workdir / "link.log").read_text()
    assert "semi_persistent_directory" in log, log[:2000]  # a worker's line the terminal was spared
    assert list(cwd.iterdir()) == []
