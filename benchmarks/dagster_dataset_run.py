"""One Dagster run of ``raw_snapshot`` + ``dataset`` + the dataset checks for the synthetic source,
as a user starts it (``dagster asset materialize``: the job's multiprocess executor, a process per
step), timed per step from the instance's records; prints one JSON object.

Issue #46: each of the six dataset checks was its own step, so its own process that imported the
code location again (150 s of wall time for ~10 s of work under ``dagster dev``); now one step
runs them. The same command also counts what reached the terminal: Beam's import warnings and
its worker harness lines, which now go to log files.

    PYTHONPATH=. .venv/bin/python benchmarks/dagster_dataset_run.py --docs 60 --workdir /tmp/dr
    # the code before a change: --code-root /path/to/a/worktree/of/the/parent/commit
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=60, help="synthetic documents")
    ap.add_argument("--direct-workers", type=int, default=2, help="Beam DirectRunner worker processes")
    ap.add_argument("--workdir", required=True, help="emptied first: DAGSTER_HOME, data, MLflow store")
    ap.add_argument("--code-root", default=str(ROOT), help="the checkout whose orchestration/ is loaded")
    args = ap.parse_args()

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    home = work / "home"
    home.mkdir(parents=True)
    config = work / "dagster.json"
    config.write_text(
        json.dumps(
            {
                "sources": ["synthetic"],
                "objectives": {"ap": {"objective": "ap"}},
                "synthetic": {"docs": args.docs, "seed": 0, "image_size": 64},
                "build_options": {"*": {"direct_workers": args.direct_workers}},
                "thresholds": {"min_documents": 10, "min_split_documents": {"train": 5, "val": 2, "test": 2}},
            }
        )
    )
    code = Path(args.code_root).resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMLINKS_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(home),
        MMLINKS_DAGSTER_CONFIG=str(config),
        MMLINKS_DATASETS_URI=str(work / "data"),
        MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}",
        PYTHONPATH=str(code),
    )
    cmd = [
        str(Path(sys.executable).parent / "dagster"),
        "asset",
        "materialize",
        "-m",
        "orchestration.definitions",
        "--select",
        "raw_snapshot,dataset",
        "--partition",
        "synthetic",
    ]
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - started
    terminal = (proc.stdout + proc.stderr).splitlines()

    os.environ["DAGSTER_HOME"] = str(home)
    import dagster as dg

    instance = dg.DagsterInstance.get()
    [run] = instance.get_runs(limit=1)
    stats = {s.step_key: s for s in instance.get_run_step_stats(run.run_id)}
    steps = {k: round(s.end_time - s.start_time, 2) for k, s in stats.items() if s.end_time and s.start_time}
    checks = [s for k, s in stats.items() if k not in ("raw_snapshot", "dataset")]
    record = instance.get_run_record_by_id(run.run_id)
    print(
        json.dumps(
            {
                "code": str(code),
                "status": run.status.value,
                "command_wall_s": round(wall, 2),
                "run_wall_s": round(record.end_time - record.start_time, 2),
                "steps": steps,
                "check_steps": len(checks),
                "checks_span_s": round(max(s.end_time for s in checks) - min(s.start_time for s in checks), 2)
                if checks
                else None,
                "checks_sum_s": round(sum(s.end_time - s.start_time for s in checks), 2),
                "terminal_lines": len(terminal),
                "terminal_gcs_apitools_warnings": sum(
                    "GCSFileSystem" in line or "apitools not found" in line for line in terminal
                ),
                "terminal_apache_beam_lines": sum("apache_beam" in line for line in terminal),
                "load_before_after": [load_before, os.getloadavg()[0]],
            },
            sort_keys=True,
        )
    )
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
