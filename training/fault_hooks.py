"""Test-only fault injection: how the resume tests kill a training worker for real.

The driver reads two environment variables once (``kill_config``) and passes the result to
the workers; after each epoch the loop calls ``after_epoch``, which does nothing unless a kill
was asked for this rank-0 epoch and has not happened yet (the marker file makes it once).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

KILL_AT_EPOCH_ENV = "MMLINKS_TEST_KILL_AT_EPOCH"
KILL_MARKER_ENV = "MMLINKS_TEST_KILL_MARKER"


def kill_config(environ=os.environ) -> dict | None:
    """{"epoch", "marker"} when both variables are set, else None (the normal case)."""
    if KILL_AT_EPOCH_ENV in environ and KILL_MARKER_ENV in environ:
        return {"epoch": environ[KILL_AT_EPOCH_ENV], "marker": environ[KILL_MARKER_ENV]}
    return None


def after_epoch(rank: int, epoch: int, kill: dict | None) -> None:
    """SIGKILL rank 0 once after epoch ``kill["epoch"]``."""
    if not kill or rank != 0 or int(kill["epoch"]) != epoch or Path(kill["marker"]).exists():
        return
    Path(kill["marker"]).write_text(str(epoch))
    os.kill(os.getpid(), signal.SIGKILL)
