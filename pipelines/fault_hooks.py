"""Test-only fault injection: how the fault scenarios SIGKILL a dataset build at a chosen stage.

``MMLINKS_TEST_KILL_BUILD_AT=STAGE[:N]`` kills the process at its N-th ``reached(STAGE)`` (read,
fetch, features, write, commit), so a test kills a real build at a known point without racing a
timer; ``MMLINKS_TEST_KILL_ONCE=FILE`` limits it to the worker that creates FILE first. Unset, a
call costs one dictionary look-up. Mirrors ``training/fault_hooks.py``."""

from __future__ import annotations

import os
import signal

KILL_BUILD_AT_ENV = "MMLINKS_TEST_KILL_BUILD_AT"
KILL_ONCE_ENV = "MMLINKS_TEST_KILL_ONCE"
STAGES = ("read", "fetch", "features", "write", "commit")

_calls: dict[str, int] = {}


def reached(stage: str) -> None:
    """SIGKILL this process when ``$MMLINKS_TEST_KILL_BUILD_AT`` names ``stage`` and its count."""
    wanted = os.environ.get(KILL_BUILD_AT_ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != stage:
        return
    _calls[stage] = _calls.get(stage, 0) + 1
    if _calls[stage] >= int(nth or 1) and _first_to_die():
        os.kill(os.getpid(), signal.SIGKILL)


def _first_to_die() -> bool:
    """True unless ``$MMLINKS_TEST_KILL_ONCE`` names a file another process created first."""
    marker = os.environ.get(KILL_ONCE_ENV)
    if not marker:
        return True
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True
