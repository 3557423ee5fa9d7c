"""Coherence retrieval (issue #17): the layout of Alikhani et al.'s Tables 4 and 5 on a pair
dataset, in one process. One JSON object on stdout (the table as rows and as markdown).

Rows: CMCA; CMCM_c for each relation of the dataset's vocabulary; CMCM; the CAM models each
also "+ SSR" (selective similarity refinement: with the config's lambda and T, and with lambda
and T chosen on validation by ``tune_refinement``). Columns: text-to-image MedR (its standard
deviation over the pools), R@1, R@5, R@10 over pools of 500 of the test split. Every model is
trained by ``benchmarks/retrieval_step.py``'s train mode (the library's model, loss, validation
MedR, test metrics; same seed and batches for all), not through Ray Tune: the ``training/grid/``
machinery is written for the linking family's variants and metrics (see docs/benchmarks.md).

    PYTHONPATH=. python benchmarks/retrieval_table.py --data DS --epochs 15 [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

COLUMNS = ("medr", "r1", "r5", "r10")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a coherence-labelled pair dataset")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--word-vectors", default="glove")
    p.add_argument("--relations", default="", help="CMCM_c rows for these relations only (comma list)")
    return p.parse_args(argv)


def table_rows(results: dict, relations: list[str]) -> list[dict]:
    """Tables 4/5's rows from ``train_mode``'s results (objective -> {"test": ...})."""
    rows = []
    order = ["cmca", *[f"cmcm-c:{r}" for r in relations], "cmcm"]
    for obj in order:
        if obj not in results:
            continue
        test = results[obj]["test"]
        name = "CMCA" if obj == "cmca" else "CMCM" if obj == "cmcm" else f"CMCM_c {obj.split(':')[1]}"
        t2i = test["t2i"]
        rows.append({"method": name, **{k: t2i[k] for k in COLUMNS}, "medr_std": t2i.get("medr_std")})
        for key, label in (("t2i_refined", " + SSR"), ("t2i_refined_tuned", " + SSR (val-tuned)")):
            if key in test:
                m = test[key]
                extra = {k: m[k] for k in ("refine_lambda", "refine_threshold") if k in m}
                rows.append(
                    {
                        "method": name + label,
                        **{k: m[k] for k in COLUMNS},
                        "medr_std": m.get("medr_std"),
                        **extra,
                    }
                )
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["| text -> image | MedR (sd) | R@1 | R@5 | R@10 |", "|---|---|---|---|---|"]
    for r in rows:
        sd = f" ({r['medr_std']:.2f})" if r.get("medr_std") is not None else ""
        out.append(
            f"| {r['method']} | {r['medr']:.2f}{sd} | {r['r1']:.1f} | {r['r5']:.1f} | {r['r10']:.1f} |"
        )
    return "\n".join(out)


def main(argv=None) -> None:
    import retrieval_step
    import torch

    from schemas.manifest import Manifest

    args = parse_args(argv)
    torch.set_num_threads(1)
    relations = Manifest.read(args.data).relation_names("the retrieval table")
    if args.relations:
        relations = [r for r in relations if r in args.relations.split(",")]
    objectives = ",".join(["cmca", *[f"cmcm-c:{r}" for r in relations], "cmcm"])
    t0 = time.perf_counter()
    flags = [
        "--data",
        args.data,
        "--mode",
        "train",
        "--objectives",
        objectives,
        "--word-vectors",
        args.word_vectors,
    ]
    flags += ["--epochs", str(args.epochs), "--batch", str(args.batch), "--lr", str(args.lr)]
    targs = retrieval_step.parse_args([*flags, "--seed", str(args.seed)])
    results = retrieval_step.train_mode(targs, *retrieval_step.load(args.data, args.word_vectors, args.seed))
    rows = table_rows(results, relations)
    out = {
        "benchmark": "retrieval_table",
        "settings": vars(args),
        "rows": rows,
        "best_epochs": {o: r["best_epoch"] for o, r in results.items()},
        "markdown": markdown(rows),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
