"""Test-only fault injection: how the fault scenarios SIGKILL a dataset build at a chosen stage.

``MMLINKS_TEST_KILL_BUILD_AT=STAGE[:N]`` makes the N-th (default first) ``reached(STAGE)`` call
of a process SIGKILL that process, so a test can kill a real build at a known point without
racing a timer. Stages, in build order: ``read`` (a raw document came out of the source),
``fetch`` (an image was fetched into the store), ``features`` (a feature vector was written to
the cache), ``write`` (a shard was written to staging), ``commit`` (the shards were moved to
their version folder, the manifest not yet written). Unset (the normal case) a call costs one
dictionary look-up. Mirrors ``training/fault_hooks.py`` for the training loop.

Under the multi-process DirectRunner the steps run in Beam's worker processes, which inherit
the variable, so the kill hits a worker, not the driver. ``MMLINKS_TEST_KILL_ONCE=FILE`` makes it
one worker: only the process that creates FILE first dies (it writes its pid there).
"""

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
