"""Library chatter off a Dagster run's log: Python logging records of the libraries the code
location imports go to one file, ``DAGSTER_HOME/mmlinks-libraries.log``.

Every process that loads the code location (the code server, the daemon, each run and, under the
multiprocess executor, each step) imports Beam, whose optional-dependency checks log at import:
"Failed to import GCSFileSystem ..." from ``apache_beam.io.filesystems`` and "apitools not found
..." through the root logger. A run showed them 11 times (issue #46). The root logger's records
would otherwise reach stderr through ``logging.lastResort`` or through the handler that a bare
``logging.warning()`` installs (``basicConfig``); with a handler on the root logger first, neither
happens. Beam's own logger stops propagating, so its INFO lines go to the file alone.

What Beam's worker processes print goes through their stderr, not this process's logging: the
assets that run Beam point their file descriptor 2 at the job's own log
(``schemas.library_output.library_output_to``), as the CLI does.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from schemas.secrets import scrub_credentials

LOG_NAME = "mmlinks-libraries.log"
# Loggers whose records are library chatter in a Dagster run, routed to the file and no further.
LIBRARY_LOGGERS = ("apache_beam",)


def library_log_path(environ: dict[str, str] | None = None) -> Path:
    """``$MMLINKS_LIBRARY_LOG``, else ``$DAGSTER_HOME/mmlinks-libraries.log``, else the temp dir."""
    env = os.environ if environ is None else environ
    if env.get("MMLINKS_LIBRARY_LOG"):
        return Path(env["MMLINKS_LIBRARY_LOG"])
    home = env.get("DAGSTER_HOME")
    return Path(home) / LOG_NAME if home else Path(tempfile.gettempdir()) / LOG_NAME


class _Scrubbed(logging.Formatter):
    """A library may log a URL with a password in it: the file gets the credential as ``***``."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub_credentials(super().format(record))


class _LibraryFileHandler(logging.FileHandler):
    """Marks the handler this module installed, so a second call adds no second one."""


def route_library_logs(path: Path | None = None) -> Path:
    """Send library loggers' records to ``path`` (default :func:`library_log_path`); idempotent."""
    path = path or library_log_path()
    root = logging.getLogger()
    installed = root.handlers + logging.getLogger(LIBRARY_LOGGERS[0]).handlers
    existing = [h for h in installed if isinstance(h, _LibraryFileHandler)]
    if existing:
        return Path(existing[0].baseFilename)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = _LibraryFileHandler(path, delay=True, encoding="utf-8")
    handler.setFormatter(_Scrubbed("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    if not root.handlers:  # a process that configured logging itself keeps its own handlers
        root.addHandler(handler)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    return path
