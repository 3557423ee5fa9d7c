"""Run the fault-injection scenarios (``tests/faults``, pytest marker ``faults``); print one JSON
object: scenarios run, faults injected, inputs fuzzed, invariant violations.

Usage: .venv/bin/python benchmarks/faults.py [--only KEYWORD] [--no-json] [-- PYTEST_ARGS]

Each scenario asserts an invariant (a damaged response is never returned as good, every bad
record is a dead letter with a reason, a crashed promotion leaves production on a version that
passed the gate, ...); a failed assertion is an invariant violation. The scenarios count what
they inject and fuzz into ``$MMLINKS_FAULTS_STATS`` (see ``tests/faults/conftest.py``); this
script sets it to a temporary file, runs pytest once in a subprocess (``-p no:xdist``), and
totals the counts per test file. Scenarios that need PostgreSQL skip where it is missing and
are reported as skipped, not as passed. Wall-clock seconds move with machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COUNTS = ("faults_injected", "inputs_fuzzed", "invariant_checks", "requests_served", "request_errors")
FIGURES = ("p50_ms", "p99_ms", "requests_per_s")  # the serving load test's, not summed


def run(only: str | None, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        stats, junit = Path(tmp) / "stats.jsonl", Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-m", "faults", "tests/faults"]
        cmd += [f"--junitxml={junit}", *(["-k", only] if only else []), *extra]
        env = {**os.environ, "MMLINKS_FAULTS_STATS": str(stats), "PYTHONPATH": str(ROOT)}
        env.setdefault("MMLINKS_FUZZ_EXAMPLES", "300")  # the suite runs 60 per fuzzer
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        outcomes = _outcomes(junit)
        counted = [json.loads(line) for line in stats.read_text().splitlines()] if stats.exists() else []
    rows: dict[str, dict] = defaultdict(lambda: {"scenarios": 0, "passed": 0, "violations": 0, "skipped": 0})
    for nodeid, outcome in outcomes.items():
        row = rows[nodeid.split("::")[0]]
        row["scenarios"] += 1
        row[{"passed": "passed", "failed": "violations", "skipped": "skipped"}[outcome]] += 1
    for entry in counted:
        row = rows[entry["scenario"].split("::")[0]]
        for key in COUNTS:
            row[key] = row.get(key, 0) + entry.get(key, 0)
        row.update({k: v for k, v in entry.get("figures", {}).items() if k in FIGURES})
    total = {
        k: sum(r.get(k, 0) for r in rows.values())
        for k in ("scenarios", "passed", "violations", "skipped", *COUNTS)
    }
    return {
        "command": " ".join(cmd[1:]),
        "pytest_exit_code": proc.returncode,
        "seconds": round(seconds, 1),
        "total": {"invariant_violations": total.pop("violations"), **total},
        "by_file": {
            k: {
                **{key: v.get(key, 0) for key in ("scenarios", "passed", "violations", "skipped", *COUNTS)},
                **{key: v[key] for key in FIGURES if key in v},
            }
            for k, v in sorted(rows.items())
        },
        "pytest_tail": proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else [],
    }


def _outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed | failed | skipped, from pytest's JUnit XML."""
    if not junit.exists():
        return {}
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        nodeid = f"{path}::{case.get('name')}"
        tags = {child.tag for child in case}
        out[nodeid] = (
            "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="pytest -k expression to run some scenarios")
    parser.add_argument("--no-json", action="store_true", help="a table instead of JSON")
    args, extra = parser.parse_known_args()
    result = run(args.only, [a for a in extra if a != "--"])
    if args.no_json:
        for name, row in result["by_file"].items():
            print(f"{name:45s} " + " ".join(f"{k}={v}" for k, v in row.items()))
        print("total: " + " ".join(f"{k}={v}" for k, v in result["total"].items()))
    else:
        print(json.dumps(result, indent=1, sort_keys=False))
    sys.exit(0 if result["pytest_exit_code"] in (0, 5) and not result["total"]["invariant_violations"] else 1)


if __name__ == "__main__":
    main()
