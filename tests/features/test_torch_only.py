"""The pure-PyTorch benchmarks of issue #20 (CLIP image features, CLIP/MiniLM text towers) run from
a checkout with ``PYTHONPATH=.`` where Ray, Beam and MLflow are not installed, as on the GPU
machine's image: here those imports are made to fail in the child process. CPU only; the same
code takes ``--device cuda``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.features.test_clip import TINY, save_tiny_clip

ROOT = Path(__file__).parents[2]

# The pipeline stack, absent from the GPU machine's image; so are lapjv and imagehash.
PIPELINE_STACK = ("ray", "apache_beam", "mlflow", "dagster")
GPU_IMAGE_ABSENT = (*PIPELINE_STACK, "lapjv", "imagehash")

# A sitecustomize that makes those packages absent: importing one raises ImportError.
BLOCKER = """
import importlib.abc, sys

class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed (blocked by the test)")
        return None

sys.meta_path.insert(0, _Absent())
"""


def _run(
    tmp_path: Path, calls: list[tuple[str, list[str]]], blocked: tuple[str, ...] = PIPELINE_STACK
) -> list[dict]:
    """Run the benchmark scripts' ``main(argv)`` one after another in ONE child process (one torch
    import) whose ``sys.path`` is the checkout's and whose pipeline stack is blocked; their
    JSON outputs, in order."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.replace("BLOCKED", repr(blocked)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    code = "import json, sys; sys.path.insert(0, sys.argv[1])\n" + "".join(
        f"import {script}; {script}.main(json.loads(sys.argv[{2 + k}])); print('@@')\n"
        for k, (script, _) in enumerate(calls)
    )
    argv = [str(ROOT / "benchmarks"), *(json.dumps(args) for _, args in calls)]
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(part) for part in proc.stdout.split("@@")[:-1]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_clip(tmp_path_factory.mktemp("torch-only") / "tiny.pt")


@pytest.mark.slow  # a child process importing torch, open_clip and MiniLM (~11 CPU-s)
def test_clip_features_and_text_tower_benchmarks_run_without_ray_beam_or_mlflow(tiny, tmp_path):
    images, texts = _run(
        tmp_path,
        [
            (
                "extractor_throughput",
                [
                    *(
                        "--extractor",
                        "clip-vit-b32",
                        "--option",
                        f"weights={tiny}",
                        "--option",
                        f"model={TINY}",
                    ),
                    *("--images", "8", "--batch-size", "4", "--rounds", "1", "--device", "cpu", "--json"),
                ],
            ),
            (
                "tower_inference",
                [
                    *("--towers", "clip", "--clip-model", TINY, "--clip-weights", str(tiny)),
                    *("--sentences", "16", "--batch", "8", "--rounds", "1", "--device", "cpu"),
                ],
            ),
        ],
    )
    assert images["device"] == "cpu" and images["beam"] == "skipped: apache_beam is not installed"
    assert images["bare_forward_images_per_s"] > 0 and images["options"]["model"] == "mmlinks-tiny-clip"
    assert texts["device"] == "cpu" and texts["rows"][0]["tower"] == "clip"
    assert texts["rows"][0]["dim"] == 16 and texts["rows"][0]["sentences_per_s"] > 0


@pytest.mark.slow  # a child process: two small training-step runs and the solver table
def test_the_gpu_run_benchmarks_run_without_the_pipeline_stack_lapjv_or_imagehash(tmp_path):
    """``benchmarks/gpu_run.sh``'s steps on the GPU image: there is no lapjv (nothing needs it since
    issue #63: both host solvers run there) and no imagehash."""
    step, table, images = _run(
        tmp_path,
        [
            ("training_step", ["--batch-docs", "3", "--repeats", "1", "--warmup", "1", "--device", "cpu"]),
            ("assignment", ["--batch", "3", "--repeats", "1", "--sizes", "mixed"]),
            ("extractor_throughput", ["--images", "4", "--batch-size", "2", "--rounds", "1", "--json"]),
        ],
        blocked=GPU_IMAGE_ABSENT,
    )
    assert set(step["objectives"]) == {"dc", "tk-full", "ap-full", "ap-half"}
    assert all(o["whole_step_ms"] > 0 for o in step["objectives"].values())
    assert all(row["same_optimum"] and row["loop_ms"] > 0 for row in table["rows"])
    assert [row["picked"] for row in table["rows"]] == ["loop", "batched"]  # k full, k half
    assert images["extractor"] == "efficientnet-lite0" and images["bare_forward_images_per_s"] > 0
