"""Where the test suite's CPU goes, test by test; prints one JSON object.

Usage:
  PYTHONPATH=benchmarks SUITE_CPU_OUT=cpu.jsonl PYTEST_ADDOPTS="-p suite_cpu" make test PYTEST_WORKERS=0
  .venv/bin/python benchmarks/suite_cpu.py cpu.jsonl [--top 25]

Loaded as a pytest plugin (``-p suite_cpu``), it appends one line per test to ``$SUITE_CPU_OUT``:
the test id, its wall seconds and the CPU-seconds spent during it (setup, call and teardown, so
a fixture's cost lands on the first test that uses it). The suite's CPU is mostly not in the
pytest process: Ray's daemons and actors, Beam workers, MLflow servers and CLI subprocesses run
beside it, so a process's own rusage misses most of it. The plugin therefore reads a cgroup's
``cpuacct.usage`` when ``$SUITE_CPU_CGROUP`` names one the run is in (every process the suite
starts stays in it), else the whole machine's busy time from ``/proc/stat`` (then run it on a
quiet machine). Run the suite in one process (``PYTEST_WORKERS=0``): with xdist two tests run at
once and share the figure.

Run as a script, it totals such a file: CPU and wall per test and per test file, the largest
tests, and how the CPU splits between many small tests and a few heavy ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path


def _cpu_seconds() -> float:
    group = os.environ.get("SUITE_CPU_CGROUP")
    if group:
        return int(Path(group, "cpuacct.usage").read_text()) / 1e9
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(fields[i]) for i in (0, 1, 2, 5, 6))  # user nice system irq softirq
    return busy / os.sysconf("SC_CLK_TCK")


try:  # the plugin half: only where pytest imports this module
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        out = os.environ.get("SUITE_CPU_OUT")
        c0, t0 = _cpu_seconds(), time.monotonic()
        yield
        if out:
            cpu, wall = _cpu_seconds() - c0, time.monotonic() - t0
            row = {"id": item.nodeid, "cpu": round(cpu, 2), "wall": round(wall, 2)}
            with open(out, "a") as fh:
                fh.write(json.dumps(row) + "\n")

except ImportError:  # pragma: no cover - the script half needs no pytest
    pass


def summarise(rows: list[dict], top: int) -> dict:
    total = sum(r["cpu"] for r in rows)
    per_file: Counter = Counter()
    tests_in: Counter = Counter()
    for r in rows:
        path = r["id"].split("::")[0]
        per_file[path] += r["cpu"]
        tests_in[path] += 1
    bands = {"< 1": (0, 1), "1-5": (1, 5), "5-20": (5, 20), ">= 20": (20, float("inf"))}
    return {
        "tests": len(rows),
        "cpu_s": round(total, 1),
        "wall_s": round(sum(r["wall"] for r in rows), 1),
        "by_cpu_per_test": {
            name: {
                "tests": sum(1 for r in rows if lo <= r["cpu"] < hi),
                "cpu_s": round(sum(r["cpu"] for r in rows if lo <= r["cpu"] < hi), 1),
            }
            for name, (lo, hi) in bands.items()
        },
        "top_tests": [
            {"id": r["id"], "cpu_s": r["cpu"], "wall_s": r["wall"]}
            for r in sorted(rows, key=lambda r: -r["cpu"])[:top]
        ],
        "top_files": [
            {"file": f, "tests": tests_in[f], "cpu_s": round(c, 1)} for f, c in per_file.most_common(top)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", help="the JSON lines file the plugin wrote ($SUITE_CPU_OUT)")
    ap.add_argument("--top", type=int, default=25, help="how many tests and files to list (default 25)")
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines() if line.strip()]
    if not rows:
        print(f"suite_cpu: error: {args.rows} holds no test", file=sys.stderr)
        return 1
    print(json.dumps(summarise(rows, args.top), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
