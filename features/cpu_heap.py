"""The glibc allocator tuning of a CPU worker (feature extraction in the build, scoring in the
link job): freed activation buffers kept in the heap (``tune_cpu_malloc``), and the heap's free
pages given back after each batch once the process has grown by a slack (``HeapTrim``);
``tune_cpu_heap`` does both. ``MMLINKS_CPU_MALLOC_TUNING=0`` turns it off."""

from __future__ import annotations

import ctypes
import os

MALLOC_TUNING_ENV = "MMLINKS_CPU_MALLOC_TUNING"  # "0" disables tune_cpu_malloc


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def _tunable_libc() -> ctypes.CDLL | None:
    """glibc, where the CPU malloc tuning applies: None on another libc or with
    ``MMLINKS_CPU_MALLOC_TUNING=0`` (then neither :func:`tune_cpu_malloc` nor :class:`HeapTrim`
    touches malloc)."""
    if os.environ.get(MALLOC_TUNING_ENV, "1") == "0":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - both are glibc's; musl lacks malloc_trim
    except (OSError, AttributeError):
        return None
    return libc


def tune_cpu_malloc(threshold: int = 1 << 30) -> bool:
    """Keep freed activation buffers in the (glibc) heap instead of unmapping them.

    torch's CPU allocator is plain malloc. Activations above glibc's mmap threshold (at most
    32 MiB; EfficientNet-Lite0 on a chunk of 8 has 38 MiB ones) are mmapped and unmapped on every
    forward and page-fault on every reuse; on the 2-core dev machine that was about half the
    forward time spent in the kernel. Raising the mmap and trim thresholds keeps them in the heap
    (1.5-2x images/s there). Process-wide; the cost is memory malloc keeps: freed buffers of
    varying sizes fragment the heap and RSS grows with the images run, which
    :class:`HeapTrim` gives back (:func:`tune_cpu_heap` does both). Returns whether it was
    applied (glibc only; ``MMLINKS_CPU_MALLOC_TUNING=0`` turns it off).
    """
    libc = _tunable_libc()
    if libc is None:
        return False
    value = ctypes.c_int(min(threshold, 2**31 - 1))
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, value)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, value))


HEAP_TRIM_SLACK = 256 << 20  # bytes a process may grow between two trims (HeapTrim)


def _resident_bytes() -> int:
    """This process's RSS from /proc (where glibc's malloc_trim exists, /proc does; psutil is not
    a runtime dependency); 0 elsewhere, so nothing is ever trimmed there."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrim:
    """Gives the glibc heap's free pages back to the OS whenever the process has grown by
    ``slack`` bytes since the last time (``malloc_trim(0)``), so a worker's RSS stays near what it
    holds instead of growing with every image it ever decoded.

    Why: with :func:`tune_cpu_malloc`'s thresholds freed buffers stay in the heap, and buffers of
    varying sizes fragment it (a feature worker grew by up to ~270 KB an image, to 4.1 GB in a
    20K-document Dask build, memory malloc had free). A trim after every batch kept RSS flat but
    took up to 20 % more time (the working set page-faults back in); trimming only after ``slack``
    bytes of growth pays that once every ~1,000 images at worst (docs/benchmarks-scale.md). Called
    after each batch; ``rss`` and ``trim`` are the process's (tests pass their own). A no-op
    without ``malloc_trim`` (not glibc) or with the tuning off."""

    def __init__(self, slack: int = HEAP_TRIM_SLACK, rss=_resident_bytes, trim=None):
        self.slack, self._rss, self.trims = slack, rss, 0
        if trim is None:
            libc = _tunable_libc()
            trim = libc.malloc_trim if libc is not None else None
        self._trim = trim
        self._floor: int | None = None

    def __call__(self) -> bool:
        """After a batch: trims when RSS is ``slack`` above what it was after the last trim (or
        the first call), or always when ``slack`` <= 0; returns whether it trimmed."""
        if self._trim is None:
            return False
        if self.slack <= 0:  # every batch (the memory floor, and what it costs: feature_heap.py)
            self._trim(0)
            self.trims += 1
            return True
        rss = self._rss()
        if self._floor is None or rss < self._floor:
            self._floor = rss
            return False
        if rss - self._floor < self.slack:
            return False
        self._trim(0)
        self.trims += 1
        self._floor = self._rss()
        return True


def tune_cpu_heap(slack: int | None = HEAP_TRIM_SLACK) -> HeapTrim | None:
    """For a CPU worker, once per process: :func:`tune_cpu_malloc`, and the :class:`HeapTrim` to
    call after each batch to give back what that tuning keeps (None where the tuning did not
    apply, so there is nothing to give back, or where ``slack`` is None: never trim; ``slack=0``
    trims after every batch)."""
    if not tune_cpu_malloc() or slack is None:
        return None
    return HeapTrim(slack)
