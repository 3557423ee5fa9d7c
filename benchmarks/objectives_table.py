"""Train every objective on the default synthetic corpus and print the objectives table (JSON).

Why one run: the quality targets are relative (AP, TK and DC each beat NoStruct by >= 5 AUC,
NoStruct beats Random, li2021 C+I+D at least matches AP on region-bearing shards), so they are
measured on the same two datasets (the demo's corpus, with and without grid-lite0 regions) at
the demo's settings. Each row also reports the loop's data-wait share (target <= 10 %).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROWS = [
    # the simplest model beside every row (issue #44): hard negatives from the first step, last epoch
    ("bag (baseline)", "plain", {"backbone": "bag", "negatives_warmup": 0, "select_by": "last"}),
    ("NoStruct", "plain", {"objective": "nostruct"}),
    ("DC", "plain", {"objective": "dc"}),
    ("TK k=full", "plain", {"objective": "tk"}),
    ("AP k=full", "plain", {"objective": "ap"}),
    ("AP k=half", "plain", {"objective": "ap", "k": "half"}),
    ("AP k=full (regions data)", "regions", {"objective": "ap"}),
    (
        "Li 2021 C+I+D Transformer",
        "regions",
        # helper-tuned for this small corpus: 2 layers, 4 heads, d 128, lr 5e-4, 100 warm-up steps
        {
            "objective": "li2021",
            "objectives": "C+I+D",
            "backbone": "transformer",
            "transformer_layers": 2,
            "transformer_heads": 4,
            "d_multi": 128,
            "lr": 5e-4,
            "warmup_steps": 100,
        },
    ),
]


def build(work: Path, docs: int, regions: bool) -> Path:
    from features.registry import GRID_LITE0
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.synthetic_corpus import SynthConfig, write_corpus

    corpus = work / "corpus"
    if not (corpus / "corpus.json").exists():  # written last: a complete corpus
        write_corpus(corpus, SynthConfig(docs=docs, seed=0))
    out = work / ("dataset-regions" if regions else "dataset")
    if not (out / "manifest.json").exists():
        build_dataset(
            BuildConfig(
                source="synthetic",
                input=str(corpus),
                out=str(out),
                regions=GRID_LITE0.name if regions else None,
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workdir", required=True, help="reused between runs: corpus and datasets are built once"
    )
    ap.add_argument("--docs", type=int, default=600)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--d-multi", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--only", help="comma-separated row names to run (default: all)")
    args = ap.parse_args()

    from models.experiment import run_experiment
    from training.config import TrainConfig
    from training.tracking import tracking_uri

    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = {"plain": build(work, args.docs, False), "regions": build(work, args.docs, True)}
    uri = tracking_uri(work)
    rows, random = [], None
    wanted = set(args.only.split(",")) if args.only else None
    for name, which, overrides in ROWS:
        if wanted and name not in wanted:
            continue
        values = {
            "data": str(data[which]),
            "epochs": args.epochs,
            "d_multi": args.d_multi,
            "lr": args.lr,
            "num_workers": args.workers,
            "storage_path": str(work / "ray_results"),
        }
        cfg = TrainConfig(**{**values, **overrides})
        t0 = time.perf_counter()
        res = run_experiment(cfg, uri, model_name=None, alias=None, report_dir=work / "reports")
        wall = time.perf_counter() - t0
        hist = [h for h in _history(uri, res.run_id)]
        random = random or res.random
        rows.append(
            {
                "method": name,
                "dataset": which,
                **{k: round(v, 2) for k, v in res.test.items() if k != "n_docs"},
                "n_docs": res.test["n_docs"],
                "best_epoch": res.best_epoch,
                # medians over epochs: steady-state loader wait share, and each epoch's start-up
                "data_wait_frac": round(statistics.median_high(h["data_wait_frac"] for h in hist), 4),
                "epoch_start_s": round(statistics.median_high(h["epoch_start_s"] for h in hist), 2),
                "step_ms": round(1000 * statistics.median_high(h["step_s"] for h in hist), 1)
                if hist
                else None,
                "wall_s": round(wall, 1),
                "run_id": res.run_id,
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps({"random": random, "rows": rows, "epochs": args.epochs, "docs": args.docs}, indent=1))


def _history(uri: str, run_id: str) -> list[dict]:
    import mlflow

    mlflow.set_tracking_uri(uri)
    path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="training_history.json")
    return json.loads(Path(path).read_text())["history"]


if __name__ == "__main__":
    main()
