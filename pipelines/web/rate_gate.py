"""The per-host gate: request-start spacing, pauses and blocks shared by every process on a machine
(one ``flock``-ed JSON file per host under ``state_dir``; per process without it).

Why not pyrate-limiter (docs/benchmarks.md, "Rate gate"): it has only N acquisitions per window,
no "nothing before T" (``Retry-After``) or "refuse until T" (a spent budget) across processes
and builds, and two processes at 20 requests/s got starts 0.2 ms apart through it."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines.web.policy import MAX_BLOCK_S

RATE_MARGIN = 1.05  # request starts are spaced RATE_MARGIN / rate apart


@dataclass
class _GateState:
    not_before: float = 0.0  # next request start allowed (spacing and pauses)
    blocked_until: float = 0.0  # requests fail at once until then (a reset beyond backoff_max)
    last_start: float = 0.0  # when the latest request actually started


class HostGate:
    """Request-start spacing, pauses and blocks for one host in one limiter domain.

    The domain is the machine (a flock-ed JSON file under ``state_dir``) or, without a
    state_dir, this process. A reservation advances ``not_before`` under the lock and the
    caller sleeps outside it, so waiting never holds the lock.
    """

    def __init__(self, state_dir: str | None, host_key: str):
        self.lock = threading.Lock()
        self.memory = _GateState()
        self.path = None
        if state_dir:
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", host_key)
            self.path = os.path.join(state_dir, f"{safe}.gate.json")
            os.makedirs(state_dir, exist_ok=True)

    def _update(self, fn: Callable[[_GateState], Any]) -> Any:
        with self.lock:
            if self.path is None:
                return fn(self.memory)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            with os.fdopen(fd, "r+b") as fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)  # released when the file closes
                raw = fh.read()
                try:
                    data = json.loads(raw) if raw else {}
                    state = _GateState(
                        float(data.get("not_before", 0.0)),
                        float(data.get("blocked_until", 0.0)),
                        float(data.get("last_start", 0.0)),
                    )
                except (ValueError, TypeError, AttributeError):
                    state = _GateState()  # a torn file (crash mid-write): start afresh
                result = fn(state)
                fh.seek(0)
                fh.truncate()
                fh.write(json.dumps(dataclasses.asdict(state)).encode())
                fh.flush()
            return result

    def reserve(self, now: float, interval: float | None) -> tuple[float, float]:
        """(start time for this request, blocked_until); start == -1 when blocked.

        A block reaching beyond ``MAX_BLOCK_S`` from now (a gate file from an older build, or
        another process's clock) is cut back to that.
        """

        def fn(s: _GateState):
            s.blocked_until = min(s.blocked_until, now + MAX_BLOCK_S)
            if s.blocked_until > now:
                return -1.0, s.blocked_until
            start = max(now, s.not_before)
            if interval:
                s.not_before = start + interval
            return start, 0.0

        return self._update(fn)

    def confirm(self, now: float, interval: float) -> float | None:
        """Record an actual start at ``now``, or return when to try again.

        Reservations space the *planned* starts; a thread that wakes late (GIL, a busy core)
        would otherwise start right before the next slot's owner. Checking the previous actual
        start keeps the real starts ``interval`` apart too.
        """

        def fn(s: _GateState):
            if now + 1e-6 < s.last_start + interval:
                return s.last_start + interval
            s.last_start = now
            return None

        return self._update(fn)

    def pause(self, until: float) -> None:
        def fn(s: _GateState):
            s.not_before = max(s.not_before, until)

        self._update(fn)

    def block(self, until: float) -> None:
        def fn(s: _GateState):
            s.blocked_until = max(s.blocked_until, until)

        self._update(fn)


_GATES: dict[tuple[str | None, str], HostGate] = {}
_SEMAPHORES: dict[tuple[str | None, str, int], threading.BoundedSemaphore] = {}
_REGISTRY_LOCK = threading.Lock()


def host_gate(state_dir: str | None, host_key: str) -> HostGate:
    # Process-wide, so every client in a process (several DoFn instances) shares one gate.
    with _REGISTRY_LOCK:
        key = (state_dir, host_key)
        if key not in _GATES:
            _GATES[key] = HostGate(state_dir, host_key)
        return _GATES[key]


def host_semaphore(state_dir: str | None, host_key: str, n: int) -> threading.BoundedSemaphore:
    with _REGISTRY_LOCK:
        key = (state_dir, host_key, n)
        if key not in _SEMAPHORES:
            _SEMAPHORES[key] = threading.BoundedSemaphore(max(1, n))
        return _SEMAPHORES[key]
