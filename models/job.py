"""Job entry point: one tracked experiment from a config file, its result as one JSON line.

Why: a cluster job submits this (``--config``: a ``TrainConfig`` dict, file or JSON) instead of
rebuilding a CLI command line; the last stdout line is ``ExperimentResult.to_dict()``, read back
by ``ExperimentResult.from_json``. Errors: one ``mmlinks: error: ...`` line, exit code 2.
Defaults follow ``mmlinks train`` (``production`` is refused: promotion goes through the gate)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from schemas.errors import MmlinksError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m models.job", description=__doc__.splitlines()[0])
    p.add_argument(
        "--config",
        required=True,
        help="TrainConfig as JSON: a file path, - for stdin, or the JSON object itself",
    )
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: see module doc)")
    p.add_argument("--workdir", default=".", help="where the default sqlite tracking store lives")
    p.add_argument("--model-name", default=None, help="registered model name ('' = do not register)")
    p.add_argument("--alias", default="candidate", help="registry alias ('' = none)")
    p.add_argument("--report-dir", default=None, help="HTML report folder (default: next to the dataset)")
    p.add_argument("--progress", action="store_true", help="an epoch progress bar on stderr")
    return p.parse_args(argv)


def load_config(source: str):
    from training.config import TrainConfig

    if source.lstrip().startswith("{"):  # the JSON itself: a cluster job cannot read the submitter's disk
        text = source
    elif source == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise MmlinksError(f"--config {source}: cannot read it ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MmlinksError(f"--config {source}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MmlinksError(f"--config {source}: expected a JSON object of TrainConfig fields")
    cfg = TrainConfig.from_dict(data, strict=True)
    cfg.validate()
    return cfg


def run(args: argparse.Namespace):
    """The ExperimentResult of the job's arguments."""
    from models.experiment import run_experiment
    from training.tracking import tracking_uri

    if args.alias == "production":
        raise MmlinksError("--alias production would skip the gate; register a candidate and promote it")
    cfg = load_config(args.config)
    if "://" not in cfg.data and not Path(cfg.data).is_dir():
        raise MmlinksError(f"{cfg.data or '(no data)'} does not exist or is not a dataset directory")
    from training.objectives.registry import default_model_name

    default_name = default_model_name(cfg.objective, cfg.relation)
    model_name = default_name if args.model_name is None else args.model_name
    return run_experiment(
        cfg,
        args.tracking_uri or tracking_uri(args.workdir),
        model_name or None,
        args.alias or None,
        progress=args.progress,
        report_dir=args.report_dir,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.stdout.flush()
    out = os.dup(1)  # the result line's channel; anything else printed goes to stderr
    os.dup2(2, 1)
    try:
        result = run(args)
    except MmlinksError as exc:
        print(f"mmlinks: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.write(out, (json.dumps(result.to_dict(), default=str) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
