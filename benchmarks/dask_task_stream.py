"""Where a Dask job's time went (issue #47): each task's compute span on each worker, recorded by
the scheduler, summed per stage and per time window; prints JSON. Record with a scheduler preload
(the local cluster's scheduler runs in the command's own process), then read::

    DASK_DISTRIBUTED__SCHEDULER__PRELOAD='["/abs/path/benchmarks/dask_task_stream.py"]' \\
    MMLINKS_TASK_STREAM_OUT=/tmp/ts.json mmlinks data build ... --runner dask
    .venv/bin/python benchmarks/dask_task_stream.py /tmp/ts.json [--window 20]

Stages are the runner's task names (``task_name``: the fused ParDos' labels); ``busy`` is each
worker's computing share per window. Not Dask's ``performance_report``: it needs bokeh and a
client of the job's own scheduler, and the runner makes its client inside the command.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re

OUT_ENV = "MMLINKS_TASK_STREAM_OUT"
_KEY = re.compile(r"^\('([^']+?)-[0-9a-f]{32}|^([^'(]+?)-[0-9a-f]{32}$")


def dask_setup(scheduler) -> None:  # the preload hook dask.distributed calls
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Recorder(SchedulerPlugin):
        name = "mmlinks-task-stream"

        def __init__(self, path: str):
            self.path, self.spans = path, []

        def transition(self, key, start, finish, *args, **kwargs):
            if start == "processing" and finish in ("memory", "erred"):
                done = kwargs.get("startstops") or []
                spans = [[d["start"], d["stop"]] for d in done if d["action"] == "compute"]
                # fetching its inputs from other workers, before it could run
                fetched = [[d["start"], d["stop"]] for d in done if d["action"] == "transfer"]
                self.spans.append([str(key), kwargs.get("worker"), spans, fetched])

        async def close(self):
            with open(self.path, "w") as f:
                json.dump(self.spans, f)

    scheduler.add_plugin(Recorder(os.environ.get(OUT_ENV, "task-stream.json")))


def stage_of(key: str) -> str:
    """``('Read+Validate-<32 hex>', 3)`` -> ``Read+Validate``; ``side-input-<32 hex>`` ->
    ``side-input``."""
    m = _KEY.match(key)
    return (m.group(1) or m.group(2)) if m else key


def summarise(records: list, window: float = 20.0) -> dict:
    """Records ``[key, worker, [[start, stop], ...], [[start, stop], ...]]`` (compute spans, then
    the spans spent fetching inputs from other workers; older records lack these) -> per stage
    (tasks, compute seconds, fetch seconds, first start and last end from the job's first start)
    and per window each worker's busy fraction."""
    spans = [(stage_of(r[0]), r[1], a, b) for r in records for a, b in r[2]]
    fetches: dict[str, float] = collections.defaultdict(float)
    for r in records:
        fetches[stage_of(r[0])] += sum(b - a for a, b in (r[3] if len(r) > 3 else []))
    if not spans:
        return {"stages": {}, "windows": [], "workers": []}
    t0 = min(a for _, _, a, _ in spans)
    end = max(b for _, _, _, b in spans) - t0
    stages: dict[str, dict] = {}
    for name, _, a, b in spans:
        s = stages.setdefault(name, {"tasks": 0, "compute_s": 0.0, "first_s": a - t0, "last_s": 0.0})
        s["tasks"] += 1
        s["compute_s"] += b - a
        s["first_s"] = min(s["first_s"], a - t0)
        s["last_s"] = max(s["last_s"], b - t0)
    workers = sorted({w for _, w, _, _ in spans})
    busy = collections.defaultdict(lambda: [0.0] * len(workers))
    for _, w, a, b in spans:
        i = workers.index(w)
        k = int((a - t0) // window)
        while t0 + k * window < b:
            lo, hi = t0 + k * window, t0 + (k + 1) * window
            busy[k][i] += max(0.0, min(b, hi) - max(a, lo))
            k += 1
    windows = [
        {"from_s": k * window, "busy": [round(x / window, 2) for x in busy[k]]}
        for k in range(int(end // window) + 1)
    ]
    for name, s in stages.items():
        s["fetch_s"] = fetches[name]
        for f in ("compute_s", "fetch_s", "first_s", "last_s"):
            s[f] = round(s[f], 2)
    order = dict(sorted(stages.items(), key=lambda kv: kv[1]["first_s"]))
    return {"span_s": round(end, 2), "workers": workers, "stages": order, "windows": windows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stream", help="the JSON the preload wrote ($MMLINKS_TASK_STREAM_OUT)")
    ap.add_argument("--window", type=float, default=20.0, help="seconds per busy-fraction window")
    args = ap.parse_args()
    try:
        with open(args.stream) as f:
            records = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"cannot read a task stream from {args.stream}: {e}") from None
    if not records:
        raise SystemExit(f"{args.stream} holds no tasks")
    print(json.dumps(summarise(records, args.window)))


if __name__ == "__main__":
    main()
