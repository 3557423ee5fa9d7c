"""What libraries write while mmlinks works goes to a log file, not the user's terminal or a
Dagster run's log: Beam's SDK worker processes, C libraries and Python logging's stderr handlers.

Shared by the CLI (``mmlinks data build``, the demos) and the Dagster assets that run Beam
(``dataset``, ``linked_<objective>``), so both front ends keep the same log next to the output.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from schemas.secrets import credential_values


@contextlib.contextmanager
def library_output_to(log_path: Path | None) -> Iterator[Path | None]:
    """Inside the block, what libraries write goes to ``log_path``; the terminal keeps ours.

    File descriptor 2 is pointed at a pipe whose reader writes to the log file, so Beam's SDK
    worker processes (started inside the block, they inherit it), C libraries and Python
    logging's stderr handlers write there: GCS/apitools import warnings,
    ``semi_persistent_directory``, "Discarding unparseable args". The reader scrubs the
    environment's credentials (``schemas.secrets``) out of every line first, as the CLI's error
    line is: a library may log a URL with a password or an echoed ``Authorization`` header.
    ``sys.stderr`` becomes a stream on the real terminal for the block, so progress bars and
    messages made inside it still reach the user. ``None``: nothing is redirected.
    """
    if log_path is None:
        yield None
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    terminal = open(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    read_end, write_end = os.pipe()
    copier = threading.Thread(
        target=_copy_scrubbed, args=(read_end, open(log_path, "wb")), name="build-log", daemon=True
    )
    copier.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    previous, sys.stderr = sys.stderr, terminal
    try:
        yield log_path
    finally:
        terminal.flush()
        sys.stderr = previous
        os.dup2(saved, 2)  # our last write end: the copier ends once worker processes have too
        os.close(saved)
        terminal.close()
        copier.join(timeout=2)


def _copy_scrubbed(read_end: int, log) -> None:
    """Copy the pipe to the log, credentials replaced by ``***``, until every writer is gone.

    Whole lines are scrubbed; a line longer than 64 KiB (a progress bar without newlines) is
    written in parts that keep the last (longest secret - 1) bytes back, so no secret is cut
    in two across parts. A log that cannot be written (its disk full) stops being written; the
    pipe is still drained, so the writers never block.
    """
    secrets = [(v.encode(), b"***") for v in credential_values()]
    keep = max((len(v) for v, _ in secrets), default=1) - 1

    def scrub(data: bytes) -> bytes:
        for value, mask in secrets:
            data = data.replace(value, mask)
        return data

    pending = b""
    writable = True  # until the log's disk is full: then the pipe is drained and nothing written

    def write(data: bytes) -> None:
        nonlocal writable
        if not writable:
            return
        try:
            log.write(data)
            log.flush()
        except OSError:  # ENOSPC (issue #62): the command's own error says it; no thread traceback
            writable = False

    while chunk := os.read(read_end, 65536):
        pending += chunk
        cut = pending.rfind(b"\n") + 1
        if not cut and len(pending) > 65536:
            pending = scrub(pending)
            cut = len(pending) - keep
        if cut:
            write(scrub(pending[:cut]))
            pending = pending[cut:]
    write(scrub(pending))
    with contextlib.suppress(OSError):
        log.close()
    os.close(read_end)


def build_log_path(out: str, name: str = "build.log") -> Path:
    """Where a job's library output goes: ``OUT/build.log`` (the last build's; ``name`` for other
    jobs), or a temporary file when OUT is a remote URI."""
    if "://" in out and not out.startswith("file://"):
        import tempfile

        return Path(tempfile.gettempdir()) / f"mmlinks-{Path(name).stem}-{os.getpid()}.log"
    return Path(out.removeprefix("file://")) / name
