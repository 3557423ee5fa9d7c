"""How many cores a training process takes: the cores it may run on, and a worker's torch threads
(issue #63). Its own module: the loop, the driver, the image side's parallel trials and the
benchmarks share out cores by the same count."""

from __future__ import annotations

import os


def torch_threads(requested: int) -> int:
    """A worker's torch threads: ``requested``, or for 0 (auto) OMP_NUM_THREADS where set (Ray
    sets it in each worker to the CPUs it reserved for it, so two workers on two cores take one
    each), else every core this process may use. Issue #63: the in-process loop at one thread
    left the second core idle (the bare loop: 51 documents/s at 1 thread, 85 at 2)."""
    if requested:
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return usable_cores()


def usable_cores() -> int:
    """The cores this process may run on (a container's or ``taskset``'s CPU set, not the host's count)."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return max(1, len(cores))
