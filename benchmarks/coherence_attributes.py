"""What a coherence retrieval model learns of each attribute (issue #45): one change at a time
against a base configuration, over seeds, on a graded-salience pair dataset
(``mmlinks data synth-coherence --salience graded`` + ``data build``).

Each variant trains through the loop ``mmlinks train`` runs (``training.driver.fit``,
``--workers 0``; issue #61 retired ``--loop inprocess``, last at commit 190e79d) and is scored on
the test split: MedR / R@10, each named attribute's top-5 match, relation AP (CMCM), beside the
attribute oracle, a linear probe of the frozen image features and the probe oracle (what the
features allow). One JSON object on stdout (per seed, mean and sd, paired differences against the
first variant), a markdown table on stderr. A variant is ``name`` or ``name:field=value,...``
(TrainConfig fields, JSON values where they parse; ``preset=paper``), over ``--base`` and the
objective's own defaults::

    PYTHONPATH=. python benchmarks/coherence_attributes.py --data DS --seeds 0,1 \\
        --base objective=cmca,epochs=30 --variants "base;layers2:image_layers=2;mean:negatives=mean"
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import numpy as np


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--base", default="", help="TrainConfig fields for every variant: field=value,...")
    p.add_argument("--variants", default="base", help="name[:field=value,...];...")
    return p.parse_args(argv)


def _fields(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def variants_of(text: str) -> list[tuple[str, dict]]:
    out = []
    for item in filter(None, text.split(";")):
        name, _, fields = item.partition(":")
        out.append((name.strip(), _fields(fields)))
    return out


def test_batches(data: str, vocab, max_tokens: int):
    from schemas.manifest import Manifest
    from training.data import make_batch
    from training.epoch_batches import validation_batches

    paths = [str(p) for p in Manifest.read(data).shard_paths(data, "test")]
    return [make_batch(t, vocab, max_tokens) for t in validation_batches(paths, 256, 0, 1, ("metadata",))]


def probe(data: str, batches) -> dict:
    """{attribute: linear-probe accuracy} on the frozen test features (fitted on train)."""
    from schemas.manifest import Manifest
    from training.retrieval.report import _probe

    report = {"attributes": {a: {"top5_match": None} for a in _attribute_names(batches)}}
    _probe(report, data, Manifest.read(data), batches)
    return {a: m["probe"] for a, m in report["attributes"].items()}


def probe_oracle(data: str, batches, pool_size: int, n_pools: int) -> dict:
    """Text -> image metrics of the probe oracle on the test pairs (the attribute oracle with the
    images' attributes read by linear probes: ``training.retrieval.attributes.probe_oracle_scores``)."""
    from schemas.manifest import Manifest
    from training.ranking import retrieval_metrics
    from training.retrieval.attributes import pair_truth, probe_oracle_scores
    from training.retrieval.report import batch_features, training_truth

    train_features, train_meta = training_truth(data, Manifest.read(data))
    values, named, _ = pair_truth([m for b in batches for m in b.metadata])
    scores = probe_oracle_scores(
        train_features, pair_truth(train_meta)[0], batch_features(batches), values, named
    )
    return retrieval_metrics(scores, pool_size=pool_size, n_pools=n_pools, seed=0)["t2i"]


def _attribute_names(batches) -> list[str]:
    from training.retrieval.attributes import pair_truth

    return pair_truth([m for b in batches for m in b.metadata])[2]


def run_one(data: str, fields: dict, seed: int, storage: str) -> dict:
    from schemas.manifest import Manifest
    from training.config import TrainConfig, preset_values
    from training.retrieval.objective import evaluate_pairs

    # the objective's own defaults under the fields given, as `mmlinks train` builds its config
    defaults = preset_values(fields.get("preset"), fields.get("objective"))
    fields = {k: v for k, v in fields.items() if k != "preset"}
    given = {"num_workers": 0, "storage_path": storage, **fields, "data": data, "seed": seed}
    cfg = TrainConfig(**{**defaults, **given})
    from training.driver import fit

    t0 = time.perf_counter()
    res = fit(cfg)
    model, vocab, best_epoch = res.model.eval(), res.vocab, res.best_epoch
    train_s = time.perf_counter() - t0
    from training.retrieval.query_bank import fill_query_bank

    fill_query_bank(model, data, Manifest.read(data), vocab, cfg.max_tokens)  # as finish_run does
    batches = test_batches(data, vocab, cfg.max_tokens)
    out = evaluate_pairs(model, batches, cfg, list(Manifest.read(data).relations or []))
    return {
        "medr": out["t2i"]["medr"],
        "r10": out["t2i"]["r10"],
        "oracle_medr": out["oracle"]["medr"],
        "top5": {a: m["top5_match"] for a, m in out["attributes"].items()},
        "chance": {a: m["chance"] for a, m in out["attributes"].items()},
        "relation_ap": out.get("relation_ap"),
        "best_epoch": best_epoch,
        "train_s": train_s,
        "pools": out["t2i"]["pools"],
        "pool_size": out["t2i"]["pool_size"],
    }


def summary(runs: dict[str, list[dict]]) -> dict:
    """Mean and sd per variant; paired differences (same seed) of each variant minus the first."""
    out: dict = {"variants": {}, "paired": {}}
    first = next(iter(runs))

    def stats(xs):
        xs = np.asarray(xs, dtype=float)
        return {"mean": float(xs.mean()), "sd": float(xs.std(ddof=1)) if len(xs) > 1 else 0.0}

    for name, rs in runs.items():
        row = {k: stats([r[k] for r in rs]) for k in ("medr", "r10")}
        row.update({f"top5_{a}": stats([r["top5"][a] for r in rs]) for a in rs[0]["top5"]})
        if rs[0].get("relation_ap"):
            row["relation_map"] = stats([np.mean(list(r["relation_ap"].values())) for r in rs])
        out["variants"][name] = row
        if name != first:
            out["paired"][f"{name} - {first}"] = {
                k: stats([a[k] - b[k] for a, b in zip(rs, runs[first], strict=True)]) for k in ("medr", "r10")
            }
    return out


def markdown(s: dict, probe_acc: dict, oracle: float, probe_medr: float) -> str:
    attrs = [k[5:] for k in next(iter(s["variants"].values())) if k.startswith("top5_")]
    head = "| variant | MedR | R@10 | " + " | ".join(f"top-5 {a}" for a in attrs) + " |"
    lines = [
        f"oracle MedR {oracle:.1f}; probe oracle MedR {probe_medr:.1f}; probe "
        + ", ".join(f"{a} {100 * probe_acc[a]:.1f}" for a in attrs),
        head,
        "|" + "---|" * (3 + len(attrs)),
    ]
    for name, v in s["variants"].items():
        cells = [f"{v['medr']['mean']:.1f} ± {v['medr']['sd']:.1f}", f"{v['r10']['mean']:.1f}"]
        cells += [f"{100 * v[f'top5_{a}']['mean']:.1f}" for a in attrs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(1)
    base = _fields(args.base)
    seeds = [int(x) for x in args.seeds.split(",")]
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as storage:
        for name, fields in variants_of(args.variants):
            for seed in seeds:
                r = run_one(args.data, {**base, **fields}, seed, storage)
                runs.setdefault(name, []).append({"seed": seed, **r})
                print(json.dumps({"variant": name, **runs[name][-1]}), file=sys.stderr)
    from training.text import Vocabulary

    batches = test_batches(args.data, Vocabulary.build([], 1), 20)
    probe_acc = probe(args.data, batches)
    s = summary(runs)
    oracle = float(np.mean([r["oracle_medr"] for rs in runs.values() for r in rs]))
    first = next(iter(runs.values()))[0]
    by_probe = probe_oracle(args.data, batches, first["pool_size"], first["pools"])
    print(markdown(s, probe_acc, oracle, by_probe["medr"]), file=sys.stderr)
    config = {"base": base, "variants": dict(variants_of(args.variants)), "seeds": seeds, "data": args.data}
    out = {
        "config": config,
        "probe": probe_acc,
        "oracle_medr": oracle,
        "probe_oracle": {"medr": by_probe["medr"], "r10": by_probe["r10"]},
        "runs": runs,
        "summary": s,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
