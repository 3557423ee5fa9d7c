"""Build throughput on a dask.distributed cluster vs the multi-process DirectRunner; print JSON.

Usage: nice -n 10 .venv/bin/python benchmarks/dask_build.py [--docs 300] [--workdir DIR] [--repeats 1]

One synthetic corpus (``mmlinks data synth``), then the same cold build (empty image store and
feature cache: every image fetched, decoded and inferred) through the real CLI in a child process,
once per configuration: the DirectRunner with 2 worker processes, the Dask runner on a local
cluster of 2 worker processes, and of 1. Every configuration pins ``--cpu-threads 1`` (one torch
thread per worker process), so N workers use N cores and the builds write the same bytes (checked:
same dataset version). Documents/s and images/s are over the whole command (process start, the
cluster's start, reading, validation, dedupe, the feature stage, shards, commit); the feature
stage is most of it here (the images' CNN forward passes). Also reports the 1-minute load average
before and after each run: the machine is shared, and a loaded machine hides any scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "direct_2_workers": ["--runner", "DirectRunner", "--direct-workers", "2"],
    "dask_2_workers": ["--runner", "dask", "--dask-workers", "2"],
    "dask_1_worker": ["--runner", "dask", "--dask-workers", "1"],
}


def run(cmd: list[str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        sys.exit(proc.returncode)
    return json.loads(proc.stdout), wall


def ratio(a: dict | None, b: dict | None) -> float | None:
    return round(a["images_per_s"] / b["images_per_s"], 2) if a and b else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--workdir", default="")
    ap.add_argument("--repeats", type=int, default=1, help="cold builds per configuration (median)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma list of " + ", ".join(CONFIGS))
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mmlinks-dask-bench-"))
    shutil.rmtree(work, ignore_errors=True)
    exe = shutil.which("mmlinks", path=str(Path(sys.executable).parent)) or "mmlinks"
    corpus = work / "corpus"
    run([exe, "data", "synth", "--out", str(corpus), "--docs", str(args.docs), "--quiet", "--json"])
    results, versions = {}, set()
    for name in args.configs.split(","):
        walls, loads = [], []
        for k in range(args.repeats):
            out = work / f"{name}-{k}"
            cmd = [exe, "data", "build", "--source", "synthetic", "--input", str(corpus), "--out", str(out)]
            cmd += [*CONFIGS[name], "--cpu-threads", "1", "--json"]
            before = os.getloadavg()[0]
            summary, wall = run(cmd)
            loads.append([round(before, 1), round(os.getloadavg()[0], 1)])
            walls.append(wall)
            versions.add(summary["dataset_version"])
            shutil.rmtree(out)
        wall = sorted(walls)[len(walls) // 2]
        images, kept = summary["build"]["features_computed"], sum(summary["splits"].values())
        results[name] = {
            "command": " ".join(cmd[:1] + ["data", "build", "..."] + CONFIGS[name] + ["--cpu-threads", "1"]),
            "wall_s": round(wall, 1),
            "walls_s": [round(w, 1) for w in walls],
            "documents_per_s": round(args.docs / wall, 2),
            "documents_kept": kept,
            "images_inferred": images,
            "images_per_s": round(images / wall, 2),
            "load_average_1m_before_after": loads,
        }
    d2, d1 = results.get("dask_2_workers"), results.get("dask_1_worker")
    direct = results.get("direct_2_workers")
    print(
        json.dumps(
            {
                "documents": args.docs,
                "cores": os.cpu_count(),
                "results": results,
                "dask_vs_direct": round(d2["images_per_s"] / direct["images_per_s"], 2)
                if d2 and direct
                else None,
                "dask_2_vs_1_workers": round(d2["images_per_s"] / d1["images_per_s"], 2)
                if d2 and d1
                else None,
                "same_dataset_version": len(versions) == 1,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
