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
from collections.abc import Iterator

from schemas.progress import polled_progress

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


def auc_noise(m: dict) -> str:
    """``; AUC standard error 0.22`` where a summary has one (``training.metrics.summarize``'s
    ``auc_se``), else "": a table's AUC is read against the split's noise."""
    se = m.get("auc_se")
    return f"; AUC standard error {se:.2f}" if isinstance(se, float) and math.isfinite(se) else ""


def heartbeat(desc: str, enabled: bool = True):
    """An elapsed-time bar for steps that report no progress of their own (a Beam run)."""
    return polled_progress(desc, enabled=enabled)
