"""Helpers every command group shares: common flags, path checks, KEY=VALUE lists."""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings
from pathlib import Path

from schemas.errors import MmlinksError

EPILOG = "Every command accepts --json (one JSON object on stdout) and --help."


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's error style: one line, ``mmlinks: error: ...``, exit code 2
    (argparse's own prints the usage block first, which buries the message)."""

    def error(self, message: str):
        self.exit(2, f"mmlinks: error: {message} (see `{self.prog} --help`)\n")


def quiet_libraries() -> None:
    """Keep library chatter (Beam's optional-dependency warnings, Ray banners) off the console."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # MLflow sets its own loggers' level (and its artifact download bars) from these when it is
    # imported, after this runs: "Creating initial MLflow database tables", pyfunc warnings
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    for name in ("apache_beam", "root", "alembic", "ray"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # MLflow logs its store's failures (a locked SQLite database, an unreachable server) with their
    # tracebacks at ERROR before raising them; the CLI says them in one line (cli/failures.py)
    logging.getLogger("mlflow").setLevel(logging.CRITICAL)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--debug", action="store_true", help="show tracebacks and library logs")


def add_workdir(p, help_text: str = "where the default mlflow.db lives (default: .)") -> None:
    p.add_argument("--workdir", default=".", help=help_text)


def add_beam_args(p, example: str = "") -> None:
    """``--beam-arg`` (repeatable) and the Beam options after ``--`` of a Beam job's command."""
    help_text = "extra Beam pipeline option, repeatable" + (f" (e.g. {example})" if example else "")
    p.add_argument("--beam-arg", action="append", metavar="ARG", help=help_text)
    p.add_argument(
        "beam_options",
        nargs=argparse.REMAINDER,
        help="Beam pipeline options after `--`, passed through verbatim (e.g. -- --project=p --region=r)",
    )


def beam_args_of(args) -> list[str]:
    """The Beam options of ``add_beam_args``: the ``--beam-arg`` values, then those after ``--``."""
    beam_options = getattr(args, "beam_options", None) or []
    return [*(getattr(args, "beam_arg", None) or []), *[a for a in beam_options if a != "--"]]


def existing_dir(value: str) -> str:
    if not Path(value).exists():
        raise MmlinksError(f"{value} does not exist")
    if not Path(value).is_dir():
        raise MmlinksError(f"{value} is not a directory")
    return value


def writable_dir(value: str) -> str:
    if Path(value).exists() and not Path(value).is_dir():
        raise MmlinksError(f"{value} exists and is not a directory")
    return value


def key_values(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MmlinksError(f"{flag} wants KEY=VALUE, not {item!r}")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def per_doc_path(args, stem: str) -> Path:
    """--per-doc-out, else a fresh WORKDIR/evaluations/STEM-SPLIT-TIME.jsonl (never overwritten)."""
    if args.per_doc_out:
        return Path(args.per_doc_out)
    base = Path(args.workdir) / "evaluations" / f"{stem}-{args.split}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base.with_suffix(".jsonl"), 1
    while path.exists():
        path, n = Path(f"{base}-{n}.jsonl"), n + 1
    return path
