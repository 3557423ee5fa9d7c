"""Library chatter off a Dagster run's log: the libraries' Python logging records go to one file,
``DAGSTER_HOME/mmlinks-libraries.log``.

Why: every process loading the code location imports Beam, whose import-time warnings showed 11
times in one run (issue #46); a handler on the root logger first keeps them off stderr, and
Beam's logger stops propagating. Beam workers' stderr goes to the job's own log
(``schemas.library_output.library_output_to``), as in the CLI."""

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
