"""Coherence retrieval over several seeds (issue #34): CMCA vs CMCM vs CMCM_c, with and without
selective refinement, and the paired differences (same seed, same batches) with their spread.

Runs ``benchmarks/retrieval_step.py``'s train mode (the library's model, loss, metrics and
evaluation, in one process) once per seed and summarises text -> image MedR and R@10 on the test
split (disjoint pools of 500: as many as the split holds). One JSON object on stdout, a markdown
table on stderr. Example::

    PYTHONPATH=. python benchmarks/coherence_seeds.py --data DS --seeds 0,1,2 --epochs 8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--objectives", default="cmca,cmcm,cmcm-c:Action")
    p.add_argument("--word-vectors", default="random")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    return p.parse_args(argv)


def rows_of(result: dict) -> dict[str, dict[str, float]]:
    """{method: {medr, r10, pools}} of one seed's train_mode result: each objective, and for
    those with a CAM the refined ranking (configured lambda, T) and the validation-tuned one."""
    out = {}
    for obj, r in result.items():
        name = {"cmca": "CMCA", "cmcm": "CMCM"}.get(obj, obj.replace("cmcm-c:", "CMCM_"))
        test = r["test"]
        out[name] = {k: test["t2i"][k] for k in ("medr", "r10", "pools", "pool_size")}
        if "t2i_refined" in test:
            out[f"{name} + SSR"] = {k: test["t2i_refined"][k] for k in ("medr", "r10")}
        if "t2i_refined_tuned" in test:
            out[f"{name} + SSR (val-tuned)"] = {k: test["t2i_refined_tuned"][k] for k in ("medr", "r10")}
    return out


def summary(per_seed: list[dict[str, dict[str, float]]]) -> dict:
    """Mean and sd over seeds per method, and paired differences (per seed, then mean and sd)."""
    methods = list(per_seed[0])
    out: dict = {"methods": {}, "paired": {}}
    for m in methods:
        for k in ("medr", "r10"):
            xs = np.array([s[m][k] for s in per_seed])
            out["methods"].setdefault(m, {})[k] = {"mean": float(xs.mean()), "sd": float(xs.std(ddof=1))}
    pairs = [(m, "CMCA") for m in methods if m.startswith("CMCM") and "SSR" not in m]
    pairs += [(m, m.split(" + ")[0]) for m in methods if "SSR" in m]
    for a, b in pairs:
        for k in ("medr", "r10"):
            d = np.array([s[a][k] - s[b][k] for s in per_seed])
            out["paired"].setdefault(f"{a} - {b}", {})[k] = {
                "mean": float(d.mean()),
                "sd": float(d.std(ddof=1)),
                "per_seed": d.tolist(),
            }
    return out


def markdown(s: dict, pool: int, pools: int, n: int) -> str:
    lines = [
        f"seeds: {n}; test pools: {pools} disjoint of {pool}",
        "",
        "| method | MedR | R@10 |",
        "|---|---|---|",
    ]
    for m, v in s["methods"].items():
        lines.append(
            f"| {m} | {v['medr']['mean']:.2f} ± {v['medr']['sd']:.2f} "
            f"| {v['r10']['mean']:.1f} ± {v['r10']['sd']:.1f} |"
        )
    lines += ["", "| paired difference | MedR | R@10 |", "|---|---|---|"]
    for m, v in s["paired"].items():
        lines.append(
            f"| {m} | {v['medr']['mean']:+.2f} ± {v['medr']['sd']:.2f} "
            f"| {v['r10']['mean']:+.1f} ± {v['r10']['sd']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    import retrieval_step as rs

    args = parse_args(argv)
    torch.set_num_threads(1)
    per_seed = []
    for seed in [int(x) for x in args.seeds.split(",")]:
        step_args = rs.parse_args(
            [
                "--data",
                args.data,
                "--mode",
                "train",
                "--objectives",
                args.objectives,
                "--epochs",
                str(args.epochs),
                "--seed",
                str(seed),
                "--word-vectors",
                args.word_vectors,
                "--batch",
                str(args.batch),
                "--lr",
                str(args.lr),
            ]
        )
        result = rs.train_mode(step_args, *rs.load(args.data, args.word_vectors, seed))
        per_seed.append(rows_of(result))
        print(json.dumps({"seed": seed, **per_seed[-1]}), file=sys.stderr)
    first = per_seed[0]["CMCA"]
    s = summary(per_seed)
    print(markdown(s, int(first["pool_size"]), int(first["pools"]), len(per_seed)), file=sys.stderr)
    print(json.dumps({"config": vars(args), "per_seed": per_seed, "summary": s}, indent=1))


if __name__ == "__main__":
    main()
