"""`mmlinks train --grid ...`: a paper's grid as parallel Ray Tune trials. The `train` parser
(cli/train.py) adds these flags with ``add_grid_args`` and calls ``cmd_train_grid`` when
``--grid`` is set; the single-run flags form the base config every trial starts from, and the
grid sets what each trial varies.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from schemas.errors import MmlinksError


def add_grid_args(group) -> None:
    """The grid flags, for the `train` parser (or an argument group of it)."""
    from training.grid import GRIDS

    group.add_argument(
        "--grid",
        choices=sorted(GRIDS),
        help="run a paper's grid as parallel Ray Tune trials, one MLflow run per trial under a parent "
        "run, and print the paper's table: paper-table2/3 = Hessel et al. 2019 (similarity x k x "
        "negatives x b); coherence-table4/5 = Alikhani et al. (CMCA, CMCM-NoAttn, CMCM, CMCM_c per "
        "relation of the dataset, each with and without selective refinement, 3 seeds, MedR's sd); "
        "news-table1/2/34 = Liu et al. (single source x loss/subword; fusion x random_drop, divide "
        "and conquer via --init-from vs from scratch; multilingual recipes), R@K and MedR both ways",
    )
    group.add_argument(
        "--grid-data",
        action="append",
        metavar="NAME=DIR",
        default=[],
        help="a dataset column of the grid's table (repeatable, e.g. MSCOCO=data/mscoco); "
        "default: --data as one column named by its manifest source",
    )
    group.add_argument(
        "--grid-b",
        metavar="B[,B...]",
        help="only these numbers of in-batch negatives b (default: the paper's 10,20,30; "
        "10 gives the main-paper tables)",
    )
    group.add_argument(
        "--grid-rows",
        metavar="ROW[,ROW...]",
        help="only these rows of the table (default: all): coherence-table4/5 rows are cmca, "
        "cmcm-noattn, cmcm, cmcm-c-RELATION (e.g. cmcm-c-Action); paper-table2/3 rows are "
        "OBJECTIVE-K-NEGATIVES (e.g. ap-full-hard, nostruct-full-mean); news-table1 rows are vsepp, "
        "vse, order, chain, hal, full (or ROW@SOURCE); news-table2 FUSION-drop, FUSION-complete, "
        "attention-scratch; "
        "news-table34 target-only, one-for-all, all-for-one",
    )
    group.add_argument(
        "--grid-repeats",
        type=int,
        metavar="N",
        help="retrieval and news grids: train every model with N seeds (--seed, --seed + 1, ...; default 3, "
        "the table's MedR sd is over them; news grids default 1)",
    )
    group.add_argument(
        "--init-from-grid",
        metavar="RUN_ID",
        help="news-table2: divide and conquer from a finished news-table1 grid (its MLflow parent run "
        "ID): each fuser row loads, per source, the Table 1 'full' trial with the best validation "
        "metric (same dataset column names and encoder flags); without it the fusers train from scratch",
    )
    group.add_argument(
        "--max-concurrent-trials",
        type=int,
        metavar="N",
        help="trials running at once (default: as many as the cluster holds full sets of workers)",
    )


def parse_grid_data(items: list[str] | None, data: str | None) -> dict[str, str]:
    """NAME=DIR pairs (in order) or, without any, ``data`` named by its manifest source."""
    from schemas.manifest import Manifest

    out: dict[str, str] = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise MmlinksError(f"--grid-data {item!r}: expected NAME=DIR")
        if name in out:
            raise MmlinksError(f"--grid-data names {name!r} twice")
        out[name] = path
    if out:
        return out
    if not data:
        raise MmlinksError("--grid needs --data DIR or at least one --grid-data NAME=DIR")
    if not Path(data).is_dir():
        raise MmlinksError(f"{data} is not a directory")
    return {Manifest.read(data).source: data}


def parse_b_values(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise MmlinksError(f"--grid-b {text!r}: expected comma-separated integers") from exc
    if not values or min(values) < 1:
        raise MmlinksError(f"--grid-b {text!r}: b must be >= 1")
    return values


def grid_selection(args: argparse.Namespace) -> dict:
    """run_grid's ``rows``, ``repeats`` and ``init_from_grid`` from --grid-rows / --grid-repeats /
    --init-from-grid (only those given, so a grid's defaults stay its own; a row no point has is
    refused by ``run_grid``)."""
    out: dict = {}
    names = [x.strip() for x in (getattr(args, "grid_rows", None) or "").split(",") if x.strip()]
    if names:
        out["rows"] = names
    if getattr(args, "grid_repeats", None) is not None:
        out["repeats"] = args.grid_repeats
    if getattr(args, "init_from_grid", None):
        out["init_from_grid"] = args.init_from_grid.strip()
    return out


def cmd_train_grid(args: argparse.Namespace, base_cfg=None) -> dict:
    """Run ``args.grid`` and return {"parent_run_id", "trials", "table", "table_text", ...}.

    ``base_cfg`` defaults to the TrainConfig the single-run `train` flags describe. Trials are
    compared, not shipped, so nothing is registered (--model-name/--alias do not apply). Exit
    code 1 when any trial failed (its cell reads "failed"; the reason is in "trials").
    """
    from models.experiment import package_run
    from training.grid import format_table, run_grid
    from training.tracking import tracking_uri

    b_values = parse_b_values(getattr(args, "grid_b", None))
    selection = grid_selection(args)
    datasets = parse_grid_data(getattr(args, "grid_data", None), getattr(args, "data", None))
    if base_cfg is None:
        from cli.train_options import train_config_from_args

        base_cfg = train_config_from_args(args, data=next(iter(datasets.values())))
    result = run_grid(
        args.grid,
        base_cfg,
        datasets,
        tracking_uri(getattr(args, "workdir", ".")),
        max_concurrent=getattr(args, "max_concurrent_trials", None),
        report_dir=Path(getattr(args, "workdir", ".")) / "reports",
        b_values=b_values,
        progress=True,
        **selection,
        package=package_run,  # each trial's model logged to its run (not registered)
    )
    if len(result.failed) == len(result.trials):
        first = result.failed[0].error if result.failed else "no trial ran"
        raise MmlinksError(
            f"every trial of {result.grid} failed (first: {first}); parent run {result.parent_run_id}"
        )
    if result.failed:
        args.exit_code = 1
    return {**result.to_dict(), "table_text": format_table(result)}


def print_grid(result: dict) -> None:
    """The human output of a grid: the table, then where the runs are."""
    print(result["table_text"], end="")
    failed = [t for t in result["trials"] if t["status"] != "ok"]
    for t in failed:
        print(f"failed: {t['dataset']} {t['key']}: {t['error']}")
    print(
        f"{len(result['trials']) - len(failed)}/{len(result['trials'])} trials in {result['seconds']:.0f} s; "
        f"parent run: {result['parent_run_id']}   tracking: {result['tracking_uri']}"
    )
