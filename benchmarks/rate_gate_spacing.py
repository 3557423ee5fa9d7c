"""Request starts of two processes sharing one host's rate: ``pipelines/web/rate_gate.py`` vs
pyrate-limiter's SQLite bucket with its file lock; JSON.

Usage: PYTHONPATH=. .venv/bin/python benchmarks/rate_gate_spacing.py [--rate 20] [--per-process 40]

Each of 2 processes takes ``--per-process`` request slots as fast as the limiter lets it, and
records the wall-clock moment each slot was granted. The gate spaces starts ``RATE_MARGIN / rate``
apart (``reserve`` + ``confirm``, as ``PoliteClient`` does); pyrate-limiter gets the same spacing
as one request per ``RATE_MARGIN / rate`` (``Rate(1, ms)``, ``use_file_lock=True``). Reported: the
smallest gap between two starts (the spacing a server sees), the most starts in any 1-s window,
and the mean rate.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pyrate_worker(db: str, rate: float, n: int, out: mp.Queue) -> None:
    from pyrate_limiter import Limiter, Rate, SQLiteBucket

    from pipelines.web.rate_gate import RATE_MARGIN

    bucket = SQLiteBucket.init_from_file(
        [Rate(1, round(1000 * RATE_MARGIN / rate))], db_path=db, use_file_lock=True
    )
    limiter = Limiter(bucket, buffer_ms=1)
    starts = []
    for _ in range(n):
        limiter.try_acquire("host", blocking=True)
        starts.append(time.time())
    out.put(starts)


def gate_worker(state_dir: str, rate: float, n: int, out: mp.Queue) -> None:
    from pipelines.web.rate_gate import RATE_MARGIN, host_gate

    gate, interval = host_gate(state_dir, "host:80"), RATE_MARGIN / rate
    starts = []
    for _ in range(n):
        start, _blocked = gate.reserve(time.time(), interval)
        time.sleep(max(0.0, start - time.time()))
        while (retry_at := gate.confirm(time.time(), interval)) is not None:
            time.sleep(max(0.0, retry_at - time.time()))
        starts.append(time.time())
    out.put(starts)


def run(worker, shared: str, rate: float, n: int) -> dict:
    queue: mp.Queue = mp.Queue()
    procs = [mp.Process(target=worker, args=(shared, rate, n, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    starts = sorted(s for _ in procs for s in queue.get())
    for p in procs:
        p.join()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    return {
        "requests": len(starts),
        "min_gap_ms": round(min(gaps) * 1000, 1),
        "max_in_any_1s": max(sum(1 for s in starts if t <= s < t + 1) for t in starts),
        "mean_rate_per_s": round((len(starts) - 1) / (starts[-1] - starts[0]), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--per-process", type=int, default=40)
    args = parser.parse_args()
    from importlib import metadata

    from pipelines.web.rate_gate import RATE_MARGIN

    with tempfile.TemporaryDirectory() as tmp:
        out = {
            "rate_per_s": args.rate,
            "spacing_ms": round(1000 * RATE_MARGIN / args.rate, 1),
            "pyrate_limiter": metadata.version("pyrate-limiter"),
            "rate_gate": run(gate_worker, str(Path(tmp) / "gate"), args.rate, args.per_process),
            "pyrate_sqlite_filelock": run(
                pyrate_worker, str(Path(tmp) / "bucket.sqlite"), args.rate, args.per_process
            ),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
