"""Time a synthetic dataset build at scale (default 5,000 documents, ~40K images); print JSON.

Usage: .venv/bin/python benchmarks/build_scale.py [--docs 5000] [--workdir DIR] [--direct-workers N]

Runs the real CLI in child processes: ``mmlinks data synth`` then ``mmlinks data build`` (cold:
empty image store and feature cache), then the same build again into a second output folder
sharing the store (warm: nothing fetched, decoded or inferred). Reports wall times, images per
second, the peak resident memory of the largest child process, and the manifest's counts.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(cmd: list[str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        sys.exit(proc.returncode)
    return json.loads(proc.stdout), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--images-min", type=int, default=5)
    ap.add_argument("--images-max", type=int, default=8)
    ap.add_argument("--workdir", default="")
    ap.add_argument("--direct-workers", type=int, default=0, help="DirectRunner processes (0: in-process)")
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mmlinks-build-"))
    shutil.rmtree(work, ignore_errors=True)
    exe = shutil.which("mmlinks", path=str(Path(sys.executable).parent)) or "mmlinks"
    synth = [exe, "data", "synth", "--out", str(work / "corpus"), "--docs", str(args.docs)]
    synth += ["--images-min", str(args.images_min), "--images-max", str(args.images_max), "--quiet", "--json"]
    _, synth_s = run(synth)
    build = [
        exe,
        "data",
        "build",
        "--input",
        str(work / "corpus"),
        "--batch-size",
        str(args.batch_size),
        "--json",
    ]
    if args.direct_workers:
        build += ["--direct-workers", str(args.direct_workers)]
    cold, cold_s = run([*build, "--out", str(work / "dataset")])
    store = str(work / "dataset" / "image-store")
    warm, warm_s = run([*build, "--out", str(work / "dataset-warm"), "--image-store", store])
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    manifest = json.loads((work / "dataset" / "manifest.json").read_text())
    counts = manifest["counts"]["pipeline"]
    run_log = json.loads((work / "dataset" / "build-log.jsonl").read_text().splitlines()[-1])
    images = run_log["features_computed"]
    print(
        json.dumps(
            {
                "command": " ".join(build),
                "documents": args.docs,
                "images_in": counts.get("images_in"),
                "images_inferred": images,
                "synth_s": round(synth_s, 1),
                "build_cold_s": round(cold_s, 1),
                "build_cold_images_per_s": round(images / cold_s, 1),
                "build_warm_s": round(warm_s, 1),
                "same_version_warm_and_cold": cold["dataset_version"] == warm["dataset_version"],
                "peak_rss_largest_process_mib": round(peak_kib / 1024),
                "splits": cold["splits"],
                "dropped": cold["dropped"],
                "pipeline_counts": counts,
                "cold_build_log": run_log,
                "shards": cold["shards"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
