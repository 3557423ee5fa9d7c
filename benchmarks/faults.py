"""Run the fault-injection scenarios (``tests/faults``, pytest marker ``faults``); print one JSON
object: scenarios run, faults injected, inputs fuzzed, invariant violations.

Usage: .venv/bin/python benchmarks/faults.py [--only KEYWORD] [--no-json] [-- PYTEST_ARGS]
       .venv/bin/python benchmarks/faults.py --from-run JUNIT_XML STATS_JSONL  (a finished run's table)

The scenarios count what they inject and fuzz into ``$MMLINKS_FAULTS_STATS``
(``tests/faults/conftest.py``); this script points it at a temporary file, runs pytest once
(``-p no:xdist``) and totals per test file; scenarios that need PostgreSQL report as skipped.
A failure is ``invariant`` (a scenario's assertion: a violation) or ``harness`` (a fixture's
error, or a failure naming one of ``HARNESS_MARKERS``, such as Ray's start timing out): not a
violation, but it fails the run too, since nothing was proven.
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
FIGURES = ("p50_ms", "p99_ms", "requests_per_s", "command_failed_after_s")  # measured, not summed
# A failure whose message names one of these is the harness's, not an invariant's: the scenario
# never reached what it asserts (Ray gives its raylet a fixed 30 s to register, which a loaded
# machine misses).
HARNESS_MARKERS = ("timed out during startup", "did not start", "Ray start timed out")
KINDS = {"passed": "passed", "invariant": "violations", "harness": "harness_failures", "skipped": "skipped"}
ROW_KEYS = ("scenarios", *KINDS.values())


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
        result = summarise(junit, stats)
    return {
        "command": " ".join(cmd[1:]),
        "pytest_exit_code": proc.returncode,
        "seconds": round(seconds, 1),
        **result,
        "pytest_tail": proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else [],
    }


def summarise(junit: Path, stats: Path) -> dict:
    """The table of one finished pytest run: its JUnit XML and its ``$MMLINKS_FAULTS_STATS``
    file. Only ``tests/faults/`` counts, so a whole-suite run (``make test`` with both set, see
    ``--from-run``) gives the same table as a run of the scenarios alone."""
    outcomes = {k: v for k, v in _outcomes(junit).items() if k.startswith("tests/faults/")}
    counted = [json.loads(line) for line in stats.read_text().splitlines()] if stats.exists() else []
    rows: dict[str, dict] = defaultdict(lambda: dict.fromkeys(ROW_KEYS, 0))
    for nodeid, (outcome, _) in outcomes.items():
        row = rows[nodeid.split("::")[0]]
        row["scenarios"] += 1
        row[KINDS[outcome]] += 1
    for entry in counted:
        row = rows[entry["scenario"].split("::")[0]]
        for key in COUNTS:
            row[key] = row.get(key, 0) + entry.get(key, 0)
        row.update({k: v for k, v in entry.get("figures", {}).items() if k in FIGURES})
    total = {k: sum(r.get(k, 0) for r in rows.values()) for k in (*ROW_KEYS, *COUNTS)}
    return {
        "total": {"invariant_violations": total.pop("violations"), **total},
        "by_file": {
            k: {
                **{key: v.get(key, 0) for key in (*ROW_KEYS, *COUNTS)},
                **{key: v[key] for key in FIGURES if key in v},
            }
            for k, v in sorted(rows.items())
        },
        "failures": [
            {"scenario": nodeid, "kind": outcome, "reason": reason}
            for nodeid, (outcome, reason) in sorted(outcomes.items())
            if outcome in ("invariant", "harness")
        ],
    }


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed | invariant | harness | skipped, the failure's reason or ""), from
    pytest's JUnit XML: ``failure`` is a failed test body, ``error`` a failed fixture."""
    if not junit.exists():
        return {}
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        nodeid = f"{path}::{case.get('name')}"
        out[nodeid] = _outcome(case)
    return out


def _outcome(case: ET.Element) -> tuple[str, str]:
    """One JUnit ``testcase``'s outcome and reason (its message, else its text's last line)."""
    for child in case:
        if child.tag not in ("failure", "error"):
            continue
        lines = [ln for ln in (child.get("message") or child.text or "").splitlines() if ln.strip()]
        reason = (lines[0] if lines else child.tag)[:1000]
        detail = f"{child.get('message') or ''}\n{child.text or ''}".splitlines()
        named = [ln.removeprefix("E").strip() for ln in detail if any(m in ln for m in HARNESS_MARKERS)]
        if named:  # the line that says why, not the first line of a quoted log
            reason = named[-1][:1000]
        return ("harness" if child.tag == "error" or named else "invariant"), reason
    if any(child.tag == "skipped" for child in case):
        return "skipped", ""
    return "passed", ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="pytest -k expression to run some scenarios")
    parser.add_argument("--no-json", action="store_true", help="a table instead of JSON")
    parser.add_argument(
        "--from-run",
        nargs=2,
        metavar=("JUNIT_XML", "STATS_JSONL"),
        help="run nothing: the table of a finished run, e.g. MMLINKS_FAULTS_STATS=STATS_JSONL "
        "PYTEST_ADDOPTS=--junitxml=JUNIT_XML make test (the whole suite, scenarios included)",
    )
    args, extra = parser.parse_known_args()
    if args.from_run:
        junit, stats = map(Path, args.from_run)
        if not junit.exists():
            sys.exit(f"faults.py: {junit} does not exist")
        result = {
            "command": f"summary of {junit} and {stats}",
            "pytest_exit_code": 0,
            **summarise(junit, stats),
        }
    else:
        result = run(args.only, [a for a in extra if a != "--"])
    if args.no_json:
        for name, row in result["by_file"].items():
            print(f"{name:45s} " + " ".join(f"{k}={v}" for k, v in row.items()))
        print("total: " + " ".join(f"{k}={v}" for k, v in result["total"].items()))
        for failed in result["failures"]:
            print(f"{failed['kind']}: {failed['scenario']}: {failed['reason']}")
    else:
        print(json.dumps(result, indent=1, sort_keys=False))
    ok = not result["total"]["invariant_violations"] and not result["total"]["harness_failures"]
    sys.exit(0 if result["pytest_exit_code"] in (0, 5) and ok else 1)


if __name__ == "__main__":
    main()
