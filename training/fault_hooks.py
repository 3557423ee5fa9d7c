"""Test-only fault injection: how the resume tests kill a training worker or driver for real.

Why from the environment: the driver reads it once (``kill_config``) and hands it to the workers,
so nothing happens unless a test set ``MMLINKS_TEST_KILL_AT_EPOCH`` / ``_HANG_AFTER_EPOCH`` (with
``MMLINKS_TEST_KILL_MARKER``, so it happens once) or ``MMLINKS_TEST_EPOCH_LOG`` (to tell a resumed
run from a restarted one)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

KILL_AT_EPOCH_ENV = "MMLINKS_TEST_KILL_AT_EPOCH"
HANG_AFTER_EPOCH_ENV = "MMLINKS_TEST_HANG_AFTER_EPOCH"
KILL_MARKER_ENV = "MMLINKS_TEST_KILL_MARKER"
EPOCH_LOG_ENV = "MMLINKS_TEST_EPOCH_LOG"


def kill_config(environ=os.environ) -> dict | None:
    """What the test asked for ({"epoch", "marker", "action", "epoch_log"}), else None (the
    normal case)."""
    found: dict = {}
    if KILL_MARKER_ENV in environ:
        for env, action in ((KILL_AT_EPOCH_ENV, "kill"), (HANG_AFTER_EPOCH_ENV, "hang")):
            if env in environ:
                found.update(epoch=environ[env], marker=environ[KILL_MARKER_ENV], action=action)
    if EPOCH_LOG_ENV in environ:
        found["epoch_log"] = environ[EPOCH_LOG_ENV]
    return found or None


def after_epoch(rank: int, epoch: int, kill: dict | None) -> None:
    """Log the epoch, then SIGKILL rank 0 (or hang it) once after epoch ``kill["epoch"]``."""
    if not kill or rank != 0:
        return
    if kill.get("epoch_log"):
        with open(kill["epoch_log"], "a") as fh:
            fh.write(f"{epoch}\n")
    if "epoch" not in kill or int(kill["epoch"]) != epoch or Path(kill["marker"]).exists():
        return
    Path(kill["marker"]).write_text(str(epoch))
    if kill.get("action") == "hang":
        while True:  # the test kills the driver's process group, and with it this worker
            time.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)


KILL_ARCHIVE_AT_ENV = "MMLINKS_TEST_KILL_ARCHIVE_AT"
_archive_calls: dict[str, int] = {}


def archive_build_reached(stage: str) -> None:
    """SIGKILL this process at the N-th ``stage`` of a streamed archive index build
    (``archive.build``) when ``$MMLINKS_TEST_KILL_ARCHIVE_AT`` is ``STAGE:N``:
    ``added`` (a chunk is in the index, not yet checkpointed), ``checkpoint`` (one was
    written) or ``finish`` (the final files written, build.json not yet removed), so the resume
    test kills a real build at a known point. Unset: one look-up."""
    wanted = os.environ.get(KILL_ARCHIVE_AT_ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != stage:
        return
    _archive_calls[stage] = _archive_calls.get(stage, 0) + 1
    if _archive_calls[stage] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
