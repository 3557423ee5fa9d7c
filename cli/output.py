"""Console conventions: human text on stderr while working, one JSON object on stdout with --json.

Ray and Beam print from background threads and worker processes; with ``--json`` the process's
stdout file descriptor is pointed at stderr while work runs, so stdout carries only the result.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from schemas.progress import polled_progress
from schemas.secrets import credential_values

_json_out: int | None = None  # the real stdout, kept aside while fd 1 points at stderr


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool) -> Iterator[None]:
    """With ``enabled``, point fd 1 at stderr for the rest of the process.

    It is not restored: Ray's and Beam's background processes and exit handlers may still print
    after the command returns (e.g. a raylet warning at shutdown), and that must not land after
    the JSON object. ``emit_json`` writes to the real stdout kept aside here.
    """
    global _json_out
    if enabled and _json_out is None:
        sys.stdout.flush()
        _json_out = os.dup(1)
        os.dup2(2, 1)
    yield


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
    in two across parts.
    """
    secrets = [(v.encode(), b"***") for v in credential_values()]
    keep = max((len(v) for v, _ in secrets), default=1) - 1

    def scrub(data: bytes) -> bytes:
        for value, mask in secrets:
            data = data.replace(value, mask)
        return data

    pending = b""
    with log:
        while chunk := os.read(read_end, 65536):
            pending += chunk
            cut = pending.rfind(b"\n") + 1
            if not cut and len(pending) > 65536:
                pending = scrub(pending)
                cut = len(pending) - keep
            if cut:
                log.write(scrub(pending[:cut]))
                log.flush()
                pending = pending[cut:]
        log.write(scrub(pending))
    os.close(read_end)


def build_log_path(out: str) -> Path:
    """Where a build's library output goes: ``OUT/build.log`` (the last build's), or a temporary
    file when OUT is a remote URI."""
    if "://" in out and not out.startswith("file://"):
        import tempfile

        return Path(tempfile.gettempdir()) / f"mmlinks-build-{os.getpid()}.log"
    return Path(out.removeprefix("file://")) / "build.log"


def _clean(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def emit_json(obj: dict) -> None:
    text = json.dumps(_clean(obj), indent=None, sort_keys=True) + "\n"
    sys.stdout.flush()
    if _json_out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    data = text.encode()
    while data:  # os.write may write only part of a large result
        data = data[os.write(_json_out, data) :]


def step(index: int, total: int, text: str) -> None:
    print(f"[{index}/{total}] {text}", file=sys.stderr, flush=True)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines)


def heartbeat(desc: str, enabled: bool = True):
    """An elapsed-time bar for steps that report no progress of their own (a Beam run)."""
    return polled_progress(desc, enabled=enabled)
