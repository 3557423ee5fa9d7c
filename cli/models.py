"""`mmlinks promote` (gated promotion, rollback) and `mmlinks report` (the HTML evaluation report)."""

from __future__ import annotations

import math
from pathlib import Path

from cli.common import EPILOG, add_common, existing_dir
from schemas import config_fields
from schemas.errors import MmlinksError


def add_gate_args(p, **defaults) -> None:
    """The promotion gate's flags, from ``Gate``'s fields (``defaults``: the command's own)."""
    from models.gate import Gate

    config_fields.add_arguments(p, Gate, defaults=defaults)


def add_parsers(sub) -> None:
    prom = sub.add_parser(
        "promote",
        help="move 'production' to the 'candidate' version if it passes the gate (or --rollback)",
        description="Score the candidate and the current production version of a registered "
        "model on the same frozen split of a dataset (linking: AUC, p@1; retrieval models of "
        "`--objective cmca|cmcm|cmcm-c`: MedR, lower is better, and R@10); move the 'production' "
        "alias to the candidate only if every gate holds, recording the previous version so --rollback can "
        "restore it. Exit code 1 when the gate refuses (the reasons are printed).",
        epilog=EPILOG,
    )
    prom.add_argument(
        "--model-name",
        default=None,
        help="registered model (default: the name `mmlinks train --objective` registered, "
        "mmlinks-OBJECTIVE[-RELATION]: the one of --data's family with a candidate, e.g. "
        "mmlinks-cmcm on a pair dataset; mmlinks-ap when none has one)",
    )
    prom.add_argument(
        "--objective",
        default=None,
        help="the objective the model was trained with, when several have candidates: names the "
        "model mmlinks-OBJECTIVE (see `mmlinks train --objective`)",
    )
    prom.add_argument(
        "--relation", default="", help="cmcm-c: the relation of that model (mmlinks-cmcm-c-RELATION)"
    )
    prom.add_argument("--data", help="dataset directory to evaluate on (required unless --rollback)")
    prom.add_argument(
        "--split",
        default=None,
        help="split of --data to evaluate on (default: test for linking models, val for retrieval "
        "models, which gate on validation MedR / R@10)",
    )
    prom.add_argument("--workdir", default=".", help="where the default mlflow.db lives (default: .)")
    prom.add_argument("--rollback", action="store_true", help="restore the previous production version")
    add_gate_args(prom)
    add_common(prom)
    prom.set_defaults(func=cmd_promote, show=show_promote)

    rep = sub.add_parser(
        "report",
        help="render the HTML evaluation report of a run or registered model",
        description="Metrics vs Random, learning curves (val loss vs val AUC by epoch), the "
        "per-document AUC histogram and document cards with predicted and true links; written to "
        "disk and logged to the run as report.html.",
        epilog=EPILOG,
    )
    rep.add_argument("run", help="MLflow run id or model URI (models:/NAME@ALIAS, models:/NAME/VERSION)")
    rep.add_argument("--workdir", default=".", help="where the default mlflow.db lives (default: .)")
    rep.add_argument("--data", help="dataset for the document cards (default: the run's dataset)")
    rep.add_argument("--out", help="output HTML file (default: WORKDIR/reports/RUN_ID.html)")
    rep.add_argument("--no-log", action="store_true", help="do not log the report to the MLflow run")
    add_common(rep)
    rep.set_defaults(func=cmd_report, show=show_report)


def cmd_promote(args) -> dict:
    from mlflow.tracking import MlflowClient

    from models.gate import Gate
    from models.registry import promote, rollback
    from training.tracking import tracking_uri

    client = MlflowClient(tracking_uri(args.workdir))
    if args.rollback:
        name = _model_name(args, client, None)
        was, now = rollback(client, name)
        return {"rolled_back": True, "name": name, "from_version": was, "to_version": now}
    if not args.data:
        raise MmlinksError("--data DIR is required (the dataset both models are scored on)")
    existing_dir(args.data)
    gate = config_fields.from_args(Gate, args)
    name = _model_name(args, client, args.data)
    result = promote(client, name, args.data, gate, args.split).to_dict()
    if not result["promoted"] and not result["already_production"]:
        args.exit_code = 1
    return result


def _model_name(args, client, data) -> str:
    """--model-name, else the default name of --objective/--relation (the objective registry's
    rule), else the one default-named model of the dataset's family holding the alias."""
    from models.registry import CANDIDATE, PRODUCTION, infer_model_name
    from schemas.manifest import Manifest
    from training.objectives.registry import default_model_name, relation_objectives, relation_problems

    if args.model_name:
        return args.model_name
    if args.objective:
        # TrainConfig's own rule (and a one-line error naming the known objectives)
        bad = relation_problems(args.objective, args.relation)
        if bad:
            raise MmlinksError(f"--objective {args.objective}: {'; '.join(bad)}")
        return default_model_name(args.objective, args.relation)
    if args.relation:
        raise MmlinksError(f"--relation needs --objective {' or '.join(relation_objectives())}")
    manifest = Manifest.read(data) if data else None
    return infer_model_name(client, manifest, PRODUCTION if data is None else CANDIDATE)


def cmd_report(args) -> dict:
    from training.report import report_for_run, write_report
    from training.tracking import tracking_uri

    uri = tracking_uri(args.workdir)
    run_id, html = report_for_run(uri, args.run, args.data)
    path = write_report(args.out or Path(args.workdir) / "reports" / f"{run_id}.html", html)
    if not args.no_log:
        from mlflow.tracking import MlflowClient

        MlflowClient(uri).log_text(run_id, html, "report.html")
    return {"run_id": run_id, "report": str(path.resolve())}


def show_promote(result: dict) -> None:
    if result.get("rolled_back"):
        moved = f"{result['from_version']} to {result['to_version']}"
        print(f"{result['name']}: production moved back from {moved}")
    elif result.get("already_production"):
        print(
            f"{result['name']}: version {result['candidate_version']} is already production (another "
            "promotion moved it there while this one ran); nothing changed"
        )
    elif result["promoted"]:
        was = result["production_version"]
        print(
            f"{result['name']}: production -> version {result['candidate_version']} "
            f"({'replacing version ' + was if was else 'the first production version'})"
        )
        print(f"  candidate:  {_metrics_text(result['candidate_metrics'])}")
        if result["production_metrics"]:
            print(f"  production: {_metrics_text(result['production_metrics'])}")
    else:
        print(f"{result['name']}: promotion of version {result['candidate_version']} refused:")
        for reason in result["failures"]:
            print(f"  - {reason}")


def _metrics_text(metrics: dict) -> str:
    """``{"auc": 61.23, "p_at_1": 40.0, "n_docs": 12, "auc_se": 2.1}`` -> ``AUC 61.2, p@1 40.0, AUC
    standard error 2.10 (12 docs)``; no standard error where there is none (one document)."""
    names = {"auc": "AUC", "p_at_1": "p@1", "p_at_5": "p@5", "medr": "MedR", "r10": "R@10", "r1": "R@1"}
    names["auc_se"] = "AUC standard error"
    parts = [
        f"{names.get(k, k)} {v:.2f}" if k == "auc_se" else f"{names.get(k, k)} {v:.1f}"
        for k, v in metrics.items()
        if isinstance(v, int | float)
        and not isinstance(v, bool)
        and not k.startswith("n_")
        and (k != "auc_se" or math.isfinite(v))
    ]
    counts = [f"{v} {k[2:]}" for k, v in metrics.items() if k.startswith("n_") and isinstance(v, int)]
    return ", ".join(parts) + (f" ({', '.join(counts)})" if counts else "")


def show_report(result: dict) -> None:
    print(f"report of run {result['run_id']}: {result['report']}")
