"""Whether a process that left something behind (an MLflow run, a trials folder) still lives.

Its own module: the tracking of abandoned runs and the image side's sweep of killed trials both
ask it, by the host and pid they recorded."""

from __future__ import annotations

import os
import platform


def process_alive(host: str | None, pid: str | int | None) -> bool:
    """Whether process ``pid`` of machine ``host`` still runs. A process on another host counts as
    gone (it cannot be asked from here), and so does this process itself: what carries its pid was
    left by an earlier process that had the same pid."""
    if host != platform.node() or not str(pid or "").isdecimal():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return int(pid) != os.getpid()


def process_gone(host: str | None, pid: str | int | None) -> bool:
    """Whether process ``pid`` of this machine has ended: what it left may be removed. Not for
    another host's (it cannot be asked from here), a pid that is no number, or this process's own
    (it may be at work in another thread) - each of which ``process_alive`` counts as gone."""
    mine = host == platform.node() and str(pid or "").isdecimal() and int(pid) != os.getpid()
    return mine and not process_alive(host, pid)
