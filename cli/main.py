"""``mmlinks``: the command line over the dataset pipelines and the training stack.

Human-readable output, or one JSON object with ``--json``; expected failures end with one
``mmlinks: error: ...`` line and exit code 2 (``--debug`` shows the traceback)."""

from __future__ import annotations

import argparse
import json
import sys

from cli import data, demo, evaluate, link, models, train
from cli.common import EPILOG, Parser, quiet_libraries
from schemas.errors import MmlinksError
from schemas.secrets import scrub_credentials

GROUPS = (demo, data, train, models, evaluate, link)  # the order of `mmlinks --help`


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="mmlinks",
        description="Discover links between the images and sentences of multimodal documents "
        "(Hessel, Lee & Mimno, EMNLP 2019): build datasets with Apache Beam, train with Ray "
        "Train, track and register models with MLflow.",
        epilog="Start with `mmlinks demo` (offline, about 4 min on 2 cores). " + EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from cli.output import emit_json, stdout_to_stderr

    argv = sys.argv[1:] if argv is None else argv
    if "--debug" not in argv:  # before the parser imports Beam (its import warnings are noise)
        quiet_libraries()
    args = build_parser().parse_args(argv)
    try:
        with stdout_to_stderr(args.json):
            result = args.func(args)
    except MmlinksError as exc:
        if args.debug:
            raise
        message = scrub_credentials(str(exc))
        print(f"mmlinks: error: {message}", file=sys.stderr)
        if args.json:  # --json promises one object on stdout, a failure's too (issue #62)
            emit_json({"error": message, "exit_code": exc.exit_code})
        return exc.exit_code
    except KeyboardInterrupt:
        print("mmlinks: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the machine around the command: a full disk, a lost server, a lock
        from cli.failures import explain

        known = explain(exc)
        if known is None or args.debug:
            raise
        print(f"mmlinks: error: {scrub_credentials(str(known))}", file=sys.stderr)
        if args.json:
            emit_json({"error": scrub_credentials(str(known)), "exit_code": known.exit_code})
        return known.exit_code
    if args.json:
        emit_json(result)
    elif args.show is not None:
        args.show(result)
    elif args.command != "demo":  # the demo prints its own summary
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return getattr(args, "exit_code", 0)


if __name__ == "__main__":
    sys.exit(main())
