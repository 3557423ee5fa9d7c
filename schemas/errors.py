"""The one exception type the CLI turns into a one-line message (no traceback)."""


class MmlinksError(Exception):
    """A user-facing failure: bad input, missing path, unsupported schema version."""
