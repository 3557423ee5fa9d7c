"""What several benchmarks measure the same way: latency percentiles and a process's memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def pct(lat, digits: int = 2) -> dict:
    """p50 and p99 of latencies in ms, and how many there were."""
    a = np.asarray(lat)
    return {f"p{p}_ms": round(float(np.percentile(a, p)), digits) for p in (50, 99)} | {"queries": len(a)}


def rss_mb(pid: int | str = "self") -> float:
    """A process's resident memory now (VmRSS), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def smaps_mb(pid: int) -> dict:
    """``/proc/PID/smaps_rollup`` in MB: Rss counts a mapped file's pages in every process that
    touched them, Pss splits them among those processes, Shared_Clean is what another maps too."""
    rows = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    mem = {r.split(":")[0]: int(r.split()[1]) for r in rows if r.split()[-1] == "kB"}
    keep = ("Rss", "Pss", "Shared_Clean", "Private_Clean", "Private_Dirty", "Anonymous")
    return {k: round(mem.get(k, 0) / 1024, 1) for k in keep}
