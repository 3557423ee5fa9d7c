"""The exception types the CLI turns into a one-line message (no traceback) and an exit code, and
the walk of an exception's chain that the layers reading a failure's cause share."""

import errno
import re


class MmlinksError(Exception):
    """A user-facing failure: bad input, missing path, unsupported schema version (exit 2)."""

    exit_code = 2


class RetryLaterError(MmlinksError):
    """A failure that says nothing about the input: something else holds what this command needs
    (a promotion lock held past the wait); the same command can succeed later. Its own exit code
    (75, sysexits' EX_TEMPFAIL) lets a scheduler retry it without retrying bad input."""

    exit_code = 75


# A note a layer adds to an exception on its way up (``BaseException.add_note``), saying what it
# cleaned up or left behind; ``cli.failures.explain`` ends its one line with such notes.
NOTE_PREFIX = "mmlinks: "


def exception_chain(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and what caused it (``__cause__``, else ``__context__``), outermost first, each once."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not e for e in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


# errno -> the words a user reads; Beam and Ray may re-raise a worker's OSError as another type
# (or as text only), so the text is matched too (``[Errno 28] No space left on device``).
_FULL = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large",
}
_FULL_TEXT = re.compile(
    r"\[errno \d+\] (no space left on device|disk quota exceeded|file too large)", re.IGNORECASE
)


def storage_full(exc: BaseException) -> str | None:
    """What ran out (``no space left on device``, ...) when ``exc`` or its cause is a full disk."""
    for e in exception_chain(exc):
        if isinstance(e, OSError) and e.errno in _FULL:
            return _FULL[e.errno]
        if found := _FULL_TEXT.search(str(e)):
            return found.group(1).lower()
    return None
