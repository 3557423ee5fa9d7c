"""``benchmarks/feature_heap.py`` (issue #47): runs the build's handler over a store's images and
says what the heap did; a folder that is not an image store is a one-line error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from pipelines.image_store import ImageStore

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "feature_heap.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env)


def test_it_runs_a_stores_images_and_reports_rss_per_image(tmp_path):
    store = ImageStore(str(tmp_path / "store"))
    rng = np.random.default_rng(0)
    for i in range(5):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (30 + 7 * i, 50, 3), dtype=np.uint8)).save(path)
        store.load(str(path))
    res = _run("--store", store.root, "--images", "4", "--batch", "2", "--trim", "off")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["images"] == 4 and got["trim"] == "off" and got["trims"] == 0
    assert [s[0] for s in got["samples"]] == [2, 4]
    assert got["rss_mib_peak_sampled"] >= got["rss_mib_first_batch"] > 0


def test_a_folder_without_an_image_store_says_so(tmp_path):
    res = _run("--store", str(tmp_path))
    assert res.returncode != 0
    assert "no image store at" in res.stderr
