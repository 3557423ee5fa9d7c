"""The exception types the CLI turns into a one-line message (no traceback) and an exit code."""


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
