"""Time `mmlinks demo` end to end (fresh work directory) and print one JSON object.

Usage: .venv/bin/python benchmarks/demo_end_to_end.py [--docs N] [--epochs N] [--workdir DIR]

Reports the demo's own JSON (test AUC, p@1, p@5, Random) plus the wall time of the whole
command including Python and Ray start-up, and the peak resident memory of the process tree.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=600)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--workdir", default="")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mmlinks-bench-"))
    shutil.rmtree(work, ignore_errors=True)
    exe = shutil.which("mmlinks", path=str(Path(sys.executable).parent)) or "mmlinks"
    cmd = [exe, "demo", "--workdir", str(work), "--docs", str(args.docs), "--epochs", str(args.epochs)]
    cmd.append("--json")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        sys.exit(proc.returncode)
    demo = json.loads(proc.stdout)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    stages = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    print(
        json.dumps(
            {
                "command": " ".join(cmd),
                "wall_time_s": round(wall, 1),
                "peak_rss_largest_process_mib": round(peak_kib / 1024),
                "demo": demo,
                "stages": stages,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
