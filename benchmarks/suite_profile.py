"""Where the test suite's time goes (issue #63: the suite under 12 minutes): the README's test
command run once with pytest's JUnit report, its tests' times summed per file and per folder.

A test's time is pytest's setup + call + teardown, so a module fixture counts in its file's first
test. Two xdist workers run files side by side: the files' times add up to about twice the wall
time when both stay busy; a file's time includes its waits for a session fixture another worker
builds. ``folders`` sums the files directly in each folder. Prints one JSON object (the ``--top``
longest files and tests); docs/benchmarks.md ("Test suite") holds the figures::

    python benchmarks/suite_profile.py               # runs `MMLINKS_CI=1 make test`, ~27 min on 2 cores
    python benchmarks/suite_profile.py --junit F.xml # reads the report of a run made before
    python benchmarks/suite_profile.py --keep F.xml  # runs it and keeps its report
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
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["make", "test"]  # the README's test command, with MMLINKS_CI=1 as .ci/run sets it


def file_of(classname: str, root: Path = ROOT) -> str:
    """The test file of a JUnit ``classname``: ``tests.a.test_b`` or ``tests.a.test_b.TestC``
    -> ``tests/a/test_b.py`` (the longest dotted prefix that is a file under ``root``); a report
    entry of no test (a module skipped or failing at collection) has no class name."""
    if not classname:
        return "(collection)"
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = "/".join(parts[:n]) + ".py"
        if (root / path).is_file():
            return path
    return "/".join(parts) + ".py"


OUTCOMES = ("passed", "skipped", "failed", "error")  # a test's is the worst of its report entries


def outcome(case: ET.Element) -> str:
    """passed, skipped, failed or error: JUnit marks all but the first by a child element."""
    for tag in ("error", "failure", "skipped"):
        if case.find(tag) is not None:
            return {"failure": "failed"}.get(tag, tag)
    return "passed"


def profile(junit: Path, root: Path = ROOT, top: int = 15) -> dict:
    """Per-file and per-folder sums of a JUnit report's test times, and the longest tests, longest
    first. A test that fails and then errors in its teardown has two report entries, each with its
    phases' time: one test, both times, the worse outcome."""
    tests: dict[tuple[str, str], list] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        key = (file_of(case.get("classname", ""), root), case.get("name", ""))
        seconds, worst = tests.get(key, (0.0, "passed"))
        tests[key] = [seconds + float(case.get("time", 0.0)), max(worst, outcome(case), key=OUTCOMES.index)]
    files: dict[str, list[float]] = defaultdict(list)
    outcomes: dict[str, int] = defaultdict(int)
    for (path, _), (seconds, result) in tests.items():
        files[path].append(seconds)
        outcomes[result] += 1
    folders: dict[str, float] = defaultdict(float)
    for path, times in files.items():
        folders[path.rsplit("/", 1)[0] if "/" in path else path] += sum(times)
    rows = sorted(
        ({"file": f, "seconds": round(sum(t), 1), "tests": len(t)} for f, t in files.items()),
        key=lambda r: -r["seconds"],
    )
    return {
        "tests": sum(outcomes.values()),
        "outcomes": dict(sorted(outcomes.items())),
        "test_seconds": round(sum(r["seconds"] for r in rows), 1),
        "folders": {k: round(v, 1) for k, v in sorted(folders.items(), key=lambda kv: -kv[1])},
        "files": rows[:top],
        "longest_tests": [
            {"test": f"{path}::{name}", "seconds": round(seconds, 1)}
            for (path, name), (seconds, _) in sorted(tests.items(), key=lambda kv: -kv[1][0])[:top]
        ],
    }


def run_suite(junit: Path) -> dict:
    """Runs the README's test command with a JUnit report; its output goes to stderr as it comes."""
    env = os.environ | {"MMLINKS_CI": "1"}
    env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} --junitxml={junit}".strip()
    t0 = time.perf_counter()
    proc = subprocess.Popen(COMMAND, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    last = ""
    for line in proc.stdout:
        sys.stderr.write(line)
        last = line.strip() or last
    wall = time.perf_counter() - t0
    return {
        "command": "MMLINKS_CI=1 " + " ".join(COMMAND),
        "returncode": proc.wait(),
        "wall_s": round(wall, 1),
        "summary": last,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--junit", type=Path, help="a JUnit report to read instead of running the suite")
    ap.add_argument("--top", type=int, default=15, help="how many of the longest files and tests to list")
    ap.add_argument("--keep", type=Path, help="also keep the run's JUnit report here (for per-test detail)")
    args = ap.parse_args(argv)
    if args.top < 1:
        ap.error(f"--top must be at least 1, not {args.top}")
    if args.junit is not None:
        if not args.junit.is_file():
            print(f"suite_profile: no JUnit report at {args.junit}", file=sys.stderr)
            return 1
        try:
            found = profile(args.junit, top=args.top)
        except ET.ParseError as exc:  # a report cut short (a killed run) or not XML
            print(f"suite_profile: {args.junit} is not a JUnit XML report ({exc})", file=sys.stderr)
            return 1
        print(json.dumps({"junit": str(args.junit), **found}))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "suite.xml"
        run = run_suite(junit)
        if not junit.is_file():
            print(f"suite_profile: the suite wrote no JUnit report ({run['summary']})", file=sys.stderr)
            return 1
        if args.keep is not None:
            shutil.copyfile(junit, args.keep)
        print(json.dumps({**run, **profile(junit, top=args.top)}))
    return 0 if run["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
