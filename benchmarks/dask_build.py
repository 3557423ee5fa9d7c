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

``--feature-stage``: the feature stage alone, on 1 and on 2 workers. The script starts each
LocalCluster itself (so it can read Dask's task stream), runs one untimed build on it (the
workers' imports and model load), then ``--repeats`` builds through ``--dask-address``; the stage
is the span of the tasks of the fused stage that holds RunInference (tasks are named by their
Beam labels: cache look-up, inference and cache write), images/s = images inferred / span. Also:
each worker's busy seconds in that stage, whose spread shows how evenly Dask placed it. The same
build on the 2-worker DirectRunner follows, for the whole command's ratio against a standing
(already started) 2-worker cluster.
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


STAGE = "CNNInference"  # in the name of the fused stage's tasks (DistinctImages+CNNCache+CNNInference+...)


def stage_span(stream: list[dict], t0: float) -> dict:
    """The feature stage in a task stream: its span and each worker's seconds in it."""
    start, stop, busy = float("inf"), 0.0, {}
    for task in stream:
        name = str(task["key"][0] if isinstance(task["key"], tuple) else task["key"])
        for ss in task["startstops"]:
            if ss["action"] == "compute" and STAGE in name.split("-")[0]:
                start, stop = min(start, ss["start"]), max(stop, ss["stop"])
                w = task["worker"]
                busy[w] = busy.get(w, 0.0) + ss["stop"] - ss["start"]
    return {
        "start_s": round(start - t0, 2),
        "span_s": round(stop - start, 2),
        "stage_s_per_worker": sorted(round(b, 2) for b in busy.values()),
    }


def feature_stage(exe: str, corpus: Path, work: Path, workers: int, repeats: int) -> dict:
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None)
    client = Client(cluster)
    try:
        client.get_task_stream()  # installs the scheduler's task-stream plugin
        base = [exe, "data", "build", "--source", "synthetic", "--input", str(corpus), "--runner", "dask"]
        base += ["--dask-address", cluster.scheduler_address, "--cpu-threads", "1", "--json"]
        run([*base, "--out", str(work / f"stage{workers}-warm")])
        runs = []
        for k in range(repeats):
            out = work / f"stage{workers}-{k}"
            before, t0 = os.getloadavg()[0], time.time()
            summary, wall = run([*base, "--out", str(out)])
            span = stage_span(client.get_task_stream(start=t0), t0)
            images = summary["build"]["features_computed"]
            runs.append(
                {
                    **span,
                    "wall_s": round(wall, 1),
                    "images": images,
                    "images_per_s": round(images / span["span_s"], 1),
                    "load_average_1m_before_after": [round(before, 1), round(os.getloadavg()[0], 1)],
                }
            )
            shutil.rmtree(out)
        median = sorted(r["images_per_s"] for r in runs)[len(runs) // 2]
        return {"workers": workers, "runs": runs, "images_per_s_median": median}
    finally:
        client.close()
        cluster.close()


def ratio(a: dict | None, b: dict | None) -> float | None:
    return round(a["images_per_s"] / b["images_per_s"], 2) if a and b else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--workdir", default="")
    ap.add_argument("--repeats", type=int, default=1, help="cold builds per configuration (median)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma list of " + ", ".join(CONFIGS))
    ap.add_argument(
        "--feature-stage", action="store_true", help="time the feature stage on 1 and 2 workers instead"
    )
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mmlinks-dask-bench-"))
    shutil.rmtree(work, ignore_errors=True)
    exe = shutil.which("mmlinks", path=str(Path(sys.executable).parent)) or "mmlinks"
    corpus = work / "corpus"
    run([exe, "data", "synth", "--out", str(corpus), "--docs", str(args.docs), "--quiet", "--json"])
    if args.feature_stage:
        one, two = (feature_stage(exe, corpus, work, n, args.repeats) for n in (1, 2))
        direct = []  # the same command on the DirectRunner, for the whole-command ratio in this run
        for k in range(args.repeats):
            cmd = [exe, "data", "build", "--source", "synthetic", "--input", str(corpus)]
            cmd += ["--out", str(work / f"direct-{k}"), *CONFIGS["direct_2_workers"], "--cpu-threads", "1"]
            direct.append(round(run([*cmd, "--json"])[1], 1))
        warm = sorted(r["wall_s"] for r in two["runs"])[len(two["runs"]) // 2]
        print(json.dumps({
            "documents": args.docs, "cores": os.cpu_count(), "one": one, "two": two,
            "feature_stage_2_vs_1_workers": round(two["images_per_s_median"] / one["images_per_s_median"], 2),
            "direct_2_workers_walls_s": direct,
            "standing_dask_2_vs_direct_wall": round(sorted(direct)[len(direct) // 2] / warm, 2),
        }, indent=2))  # fmt: skip
        return
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
