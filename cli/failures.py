"""One line for the failures of the machine around a command (issue #62): a full disk, a tracking
server that does not answer, a tracking database another process holds locked.

Why: they surface deep inside MLflow, SQLAlchemy, Ray or Beam (``mmlinks train`` printed 245-624
traceback lines). ``explain`` reads the exception chain and names what failed and what to do; the
traceback goes to the log. Anything else is left to the caller (a bug keeps its traceback)."""

from __future__ import annotations

import errno
import re

from schemas.errors import NOTE_PREFIX, MmlinksError, RetryLaterError, exception_chain

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_SPACE_TEXT = re.compile(r"\[Errno (28|122|27)\][^\n]*|No space left on device|Disk quota exceeded")
_LOCKED = re.compile(r"database is locked|database table is locked", re.I)
# MLflow's REST client says "API request to URL failed"; requests underneath names the path
_SERVER = re.compile(r"API request to (?P<url>\S+) failed|url: (?P<path>/api/2\.0/mlflow/\S*)")


def explain(exc: BaseException) -> MmlinksError | None:
    """The one-line error for a full disk, an unreachable tracking server or a locked tracking
    database anywhere in ``exc``'s chain (or in the text a runner wrapped it in); None otherwise.
    Notes the layers below added on the way (``NOTE_PREFIX``: what they cleaned up) end the line."""
    found = _explain(exc)
    notes = [
        n.removeprefix(NOTE_PREFIX)
        for e in exception_chain(exc)
        for n in getattr(e, "__notes__", ())
        if isinstance(n, str) and n.startswith(NOTE_PREFIX)
    ]
    if found is None or not notes:
        return found
    return type(found)(f"{found}; {'; '.join(dict.fromkeys(notes))}")


def _explain(exc: BaseException) -> MmlinksError | None:
    chain = exception_chain(exc)
    text = "\n".join(str(e) for e in chain)
    for e in chain:
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            where = f" writing {e.filename}" if e.filename else ""
            return MmlinksError(
                f"out of space{where} ({e.strerror or 'no space left on device'}): free space there and "
                "run the same command again (details: --debug)"
            )
    if _NO_SPACE_TEXT.search(text):
        step = re.search(r"\[while running '([^']+)'\]", text)
        where = f" in {step.group(1)}" if step else ""
        return MmlinksError(
            f"out of space{where} (no space left on device): free space where the command writes and run "
            "the same command again (details: --debug)"
        )
    if _LOCKED.search(text):
        return RetryLaterError(
            "the MLflow tracking database is locked by another process (sqlite allows one writer): "
            "run the same command again when it is free, or track to an MLflow server (MLFLOW_TRACKING_URI)"
        )
    found = _SERVER.search(text)
    if found:
        url = found.groupdict().get("url") or "MLFLOW_TRACKING_URI"
        server = re.sub(r"(/api/|/ajax-api/).*", "", url)
        return RetryLaterError(
            f"the MLflow tracking server at {server} does not answer: start or restart it (or point "
            "MLFLOW_TRACKING_URI at one that runs) and run the same command again (details: --debug)"
        )
    return None
