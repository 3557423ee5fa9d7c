"""`mmlinks train`: one training run (or a paper grid with --grid) on a built dataset.

Every model/objective/Ray flag is generated from ``TrainConfig``'s fields (their defaults, help
and choices live there); this module adds only what is not a training option: the dataset,
the MLflow work directory and the registration.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cli.common import EPILOG, add_common, add_workdir, existing_dir
from cli.train_options import add_registration_args, add_train_args, train_config_from_args
from schemas.errors import MmlinksError


def add_parsers(sub) -> None:
    from cli.grid import add_grid_args

    train = sub.add_parser(
        "train",
        help="train a model with Ray Train, evaluate on test, register in MLflow",
        description="Train on a built dataset, keep the best checkpoint by a label-free "
        "validation signal (--select-by), evaluate it on the test split, log everything to MLflow "
        "(MLFLOW_TRACKING_URI, or sqlite under --workdir) and register the model. The defaults "
        "deviate from Hessel et al. 2019 where it fails on documents with a style of their own; "
        "--preset paper restores it (docs/training.md).",
        epilog=EPILOG,
    )
    train.add_argument(
        "--data", help="dataset directory (holds manifest.json); required unless --grid-data is given"
    )
    add_workdir(train)
    add_train_args(train)
    add_registration_args(train)
    add_grid_args(train.add_argument_group("paper grids (Ray Tune: one trial per grid point and dataset)"))
    add_common(train)
    train.set_defaults(func=cmd_train, show=show_train)


def cmd_train(args) -> dict:
    from training.run_inputs import read_inputs

    if getattr(args, "grid", None):
        from cli.grid import cmd_train_grid

        return cmd_train_grid(args)
    if not args.data:
        raise MmlinksError("train needs --data DIR (or --grid with --grid-data NAME=DIR)")
    existing_dir(args.data)
    if args.alias == "production":
        raise MmlinksError(
            "--alias production would skip the gate; register a candidate and run `mmlinks promote`"
        )
    cfg = train_config_from_args(args)
    # config and dataset errors in one line, before torch / Ray / MLflow load; read once, the
    # run is handed what was read
    inputs = read_inputs(cfg)
    from models.experiment import run_experiment
    from training.objectives.registry import default_model_name
    from training.tracking import tracking_uri

    default_name = default_model_name(cfg.objective, cfg.relation)
    model_name = default_name if args.model_name is None else args.model_name
    res = run_experiment(
        inputs,
        tracking_uri(args.workdir),
        model_name or None,
        args.alias or None,
        progress=True,
        report_dir=Path(args.workdir) / "reports",  # with the store, never the current folder
    )
    return res.to_dict()


def choice_line(choice: dict) -> str:
    """What ``mmlinks train`` prints of the image side ``--image-centring auto`` measured (a
    ``Choice.to_dict()``): the pick, every candidate's score and, where the pick is not the top
    score, why."""
    from training.link.image_side import PICK_REASONS

    def measured(scores: dict) -> str:
        return ", ".join(f"{k} {v:.3f}" for k, v in scores.items() if v is not None)

    first, final = measured(choice.get("scores") or {}), measured(choice.get("finalists") or {})
    if final:  # the first round's best two, read again after the run's epochs
        first = f"{final} after {choice['trial_epochs']} epochs; {first} after {choice['first_epochs']}"
    reason = choice.get("reason")
    return (
        f"image side: {choice['name']}"
        + (f" (within-document link structure: {first})" if first else "")
        + (f"; {PICK_REASONS[reason]}" if reason in PICK_REASONS else "")
        + ("; the run is its trial, not trained again" if choice.get("trial_kept") else "")
    )


def show_train(result: dict) -> None:
    from cli.output import auc_noise, table

    if "table_text" in result:
        from cli.grid import print_grid

        print_grid(result)
        return
    for warning in result.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)
    if result.get("choice"):  # what --image-centring auto measured (issue #60)
        print(choice_line(result["choice"]))
    if result.get("already_finished"):
        version = f"version {result['model_version']}" if result["model_version"] else "no registered version"
        print(
            f"this training run already finished (MLflow run {result['run_id']}, {version}); "
            "nothing was trained and no model version was registered"
        )
        print(f"model: {result['model_uri']}   run: {result['run_id']}   tracking: {result['tracking_uri']}")
        return
    if result["test"] is None:
        print(f"best epoch {result['best_epoch']}; the test split has no labelled document: not evaluated")
        print(f"model: {result['model_uri']}   run: {result['run_id']}   tracking: {result['tracking_uri']}")
        return
    if "t2i" in result["test"]:  # a retrieval objective (training/retrieval/)
        show_retrieval(result)
        return
    t, r = result["test"], result["random"]
    rows = [
        ["model", *(f"{t[k]:.1f}" for k in ("auc", "p_at_1", "p_at_5"))],
        ["Random", *(f"{r[k]:.1f}" for k in ("auc", "p_at_1", "p_at_5"))],
    ]
    print(f"test split, {t['n_docs']} documents (best epoch {result['best_epoch']}{auc_noise(t)}):")
    print(table(rows, ["method", "AUC", "p@1", "p@5"]))
    print(f"model: {result['model_uri']}   run: {result['run_id']}   tracking: {result['tracking_uri']}")


def show_retrieval(result: dict) -> None:
    t = result["test"]
    pool, epoch = t["t2i"]["pool_size"], result["best_epoch"]
    print(f"test split, {t['pairs']} pairs, pools of {pool} (best epoch {epoch}):")
    rows = [("text->image", t["t2i"]), ("image->text", t["i2t"])]
    if "t2i_refined" in t:
        rows.append(("text->image refined", t["t2i_refined"]))
    if "t2i_refined_tuned" in t:
        tuned = t["t2i_refined_tuned"]
        rows.append((f"  tuned (l {tuned['refine_lambda']:g}, T {tuned['refine_threshold']:g})", tuned))
    print(f"{'':22s} {'MedR':>6s} {'R@1':>6s} {'R@5':>6s} {'R@10':>6s}")
    for name, m in rows:
        print(f"{name:22s} {m['medr']:6.1f} {m['r1']:6.1f} {m['r5']:6.1f} {m['r10']:6.1f}")
    for rel, m in (t.get("relations") or {}).items():
        if m.get("pools"):
            print(f"{'  ' + rel:22s} {m['medr']:6.1f} {m['r1']:6.1f} {m['r5']:6.1f} {m['r10']:6.1f}")
    if t.get("relation_ap"):
        print("relation AP: " + ", ".join(f"{k} {v:.2f}" for k, v in t["relation_ap"].items()))
    print(f"model: {result['model_uri']}   run: {result['run_id']}   tracking: {result['tracking_uri']}")
    if result.get("parent_run_id"):  # the news family's staged recipe: the run above is its last stage
        print(f"stages: parent run {result['parent_run_id']} (one nested run per stage)")
    if result.get("report"):
        print(f"report: {result['report']}")
