"""`mmlinks data ...`: the subcommand group, one module per kind of subcommand: synthetic corpora
(``cli/data_synth.py``), builds and crawls (``cli/data_build.py``), listings, inspection and
migration (``cli/data_inspect.py``)."""

from __future__ import annotations

from cli import data_build, data_inspect, data_synth
from cli.common import EPILOG


def add_parsers(sub) -> None:
    data = sub.add_parser(
        "data",
        help="dataset commands: synth, build, inspect",
        description="Create, build and inspect datasets.",
        epilog=EPILOG,
    )
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

    data_synth.add_parsers(dsub)
    data_build.add_parsers(dsub)
    data_inspect.add_parsers(dsub)
