"""The image-confound ablation (issue #33): one training run per row on one dataset, one change
at a time, through the same path as ``mmlinks train --workers 0`` (``run_experiment``: fit,
checkpoint choice, test evaluation), each row's test AUC / p@1 / p@5, best epoch and median
training-step time. Prints one JSON object; docs/benchmarks.md ("Documents whose images look
alike") holds the table and the commands.

Make the dataset with the real commands first, e.g.::

    mmlinks data synth --out RAW --docs 1000 --seed 1 --topic-words 3
    mmlinks data build --source synthetic --input RAW --out DS --split-sizes val=100,test=200
    mmlinks data confound DS --out DS-LOOK --image-look 0.8
    python benchmarks/image_confound.py --data DS-LOOK --rows paper,default,centring-none
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The demo's width and rate, 10 epochs: the setting. Every other field is TrainConfig's.
BASE = dict(epochs=10, d_multi=256, lr=1e-3, num_workers=0)
PAPER = dict(image_centring="none", negatives_warmup=0)  # the image side before issue #33
ROWS: dict[str, dict] = {
    # the simplest model beside every row (issue #44): hard negatives from the first step, last epoch
    "bag": {"backbone": "bag", "negatives_warmup": 0, "select_by": "last"},
    "paper": PAPER,  # today's model before the change (text side of #15 kept)
    "dropout-0": {**PAPER, "image_dropout": 0.0},
    "words-random-bag": {**PAPER, "word_vectors": "random", "text_pooling": "bag"},
    "li2021-C+I": {**PAPER, "objective": "li2021", "objectives": "C+I"},
    "margin-0.5": {**PAPER, "margin": 0.5},
    "epochs-20": {**PAPER, "epochs": 20},
    "centring-doc": {**PAPER, "image_centring": "doc"},
    "centring-doc+raw": {**PAPER, "image_centring": "doc+raw"},
    "negatives-mean": {**PAPER, "negatives": "mean"},
    "mean+doc": {**PAPER, "negatives": "mean", "image_centring": "doc"},
    "mean+doc+raw": {**PAPER, "negatives": "mean", "image_centring": "doc+raw"},
    "centring-balanced": {**PAPER, "image_centring": "balanced"},
    "default": {},  # mmlinks' defaults: balanced centring, 3 mean-negative epochs, then hard
    "default-no-warmup": {"negatives_warmup": 0},
    "default-centring-none": {"image_centring": "none"},
    "default-centring-doc+raw": {"image_centring": "doc+raw"},
    "default-select-widest": {},  # the checkpoint of the widest gap (WITHIN_TOLERANCE 0)
    "default-mean-negatives": {"negatives": "mean"},
    "default-dropout-0": {"image_dropout": 0.0},
    "default-li2021-C+I": {"objective": "li2021", "objectives": "C+I"},
    "default-mean-weight-0.25": {"image_mean_weight": 0.25},  # balanced centring's mean part (1)
    "default-mean-weight-0.5": {"image_mean_weight": 0.5},
    "default-mean-weight-1": {"image_mean_weight": 1.0},
    "default-mean-weight-2": {"image_mean_weight": 2.0},
}
# Rows that change a module constant rather than a TrainConfig field (in-process runs only).
CONSTANTS: dict[str, dict] = {
    "default-select-widest": {"training.loop.WITHIN_TOLERANCE": 0.0},
}


def run_row(data: str, overrides: dict, seed: int, constants: dict | None = None) -> dict:
    import importlib

    from models.experiment import run_experiment
    from training.config import TrainConfig

    cfg = TrainConfig(data=data, **{**BASE, "seed": seed, **overrides})
    targets = {}
    for dotted in constants or {}:
        module, _, name = dotted.rpartition(".")
        targets[dotted] = (importlib.import_module(module), name)
    saved = {k: getattr(m, n) for k, (m, n) in targets.items()}
    with tempfile.TemporaryDirectory(prefix="image-confound-") as wd:
        t0 = time.perf_counter()
        try:
            for k, (m, n) in targets.items():
                setattr(m, n, constants[k])
            r = run_experiment(cfg, f"sqlite:///{wd}/mlflow.db", None, None, report_dir=wd)
        finally:
            for k, (m, n) in targets.items():
                setattr(m, n, saved[k])
        seconds = time.perf_counter() - t0
        history = json.loads(next(Path(wd).rglob("training_history.json")).read_text())["history"]
    steps = [h["step_s"] for h in history if h.get("step_s")]
    return {
        "auc": round(r.test["auc"], 1),
        "p_at_1": round(r.test["p_at_1"], 1),
        "p_at_5": round(r.test["p_at_5"], 1),
        "best_epoch": r.best_epoch,
        "step_ms": round(1000 * statistics.median(steps), 1) if steps else None,
        "seconds": round(seconds, 1),
        "flat_warning": bool(r.warnings),
        "val_within": [round(h["val_within"], 3) for h in history],
        "val_auc": [round(h["val_auc"], 1) for h in history],
        "lr": [float(f"{h['lr']:.2g}") for h in history],
        "train_loss": [round(h["train_loss"], 3) for h in history],
        "val_loss": [round(h["val_loss"], 3) for h in history],
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a built dataset (e.g. from mmlinks data confound)")
    p.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"comma-separated, of: {', '.join(ROWS)}; or NAME=JSON, TrainConfig overrides",
    )
    p.add_argument("--seeds", default="0", help="comma-separated training seeds; one run per row and seed")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a BASE field for every row, e.g. --set epochs=50 --set d_multi=1024",
    )
    args = p.parse_args(argv)
    from pipelines.confounds import dataset_confounds

    names = []
    for row in re.split(r",(?![^{]*})", args.rows):  # commas outside a NAME={...} row's JSON
        name, eq, overrides = row.partition("=")
        if eq:
            ROWS[name] = json.loads(overrides)  # a row of TrainConfig overrides: NAME={"field": value}
        if name:
            names.append(name)
    unknown = [r for r in names if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    for item in args.set:
        field, _, value = item.partition("=")
        try:
            BASE[field] = json.loads(value)  # numbers, booleans
        except json.JSONDecodeError:
            BASE[field] = value
    seeds = [int(s) for s in args.seeds.split(",") if s]
    figures = dataset_confounds(args.data, ["train", "test"])
    out = {
        "data": args.data,
        "seeds": seeds,
        "base": BASE,
        "image_ratio": {s: f.image_ratio for s, f in figures.items()},
        "text_share": {s: f.text_share for s, f in figures.items()},
        "rows": {},
    }
    for name in names:
        runs = []
        for seed in seeds:
            runs.append(run_row(args.data, ROWS[name], seed, CONSTANTS.get(name)))
            print(json.dumps({name: {"seed": seed, **runs[-1]}}), file=sys.stderr, flush=True)
        row: dict = {"overrides": ROWS[name], "runs": runs}
        for k in ("auc", "p_at_1", "p_at_5"):
            row[f"mean_{k}"] = round(statistics.mean(r[k] for r in runs), 1)
            row[f"min_{k}"] = min(r[k] for r in runs)
        out["rows"][name] = row
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
