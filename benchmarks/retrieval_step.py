"""Coherence retrieval (issue #17): CMCM vs CMCA on a built pair dataset, in one process.

Two modes, one JSON object on stdout:

- ``--mode step``: the time of one training step (forward, loss, backward, Adam) of CMCA and of
  CMCM on the same batch, alternated round by round so that load drifts hit both alike; the
  ratio CMCM / CMCA of the medians (target <= 1.2).
- ``--mode train``: trains each ``--objectives`` entry from the same seed on the same batches
  (the training loop's recipe without Ray: Adam, batches of ``--batch`` pairs reshuffled each
  epoch, the epoch with the lowest validation MedR kept), then scores the test split: MedR and
  R@K text-to-image without and with selective refinement, per relation, relation AP.

It uses the library's model, loss, metrics and evaluation (training/retrieval/) and reads the
shards with pyarrow; no Ray, MLflow or Beam. Example::

    PYTHONPATH=. python benchmarks/retrieval_step.py --data DS --mode train --epochs 15
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time

import numpy as np
import torch


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a pair dataset (mmlinks data synth-coherence + build)")
    p.add_argument("--mode", choices=("step", "train"), default="step")
    p.add_argument("--objectives", default="cmca,cmcm", help="comma-separated (cmca, cmcm, cmcm-c:RELATION)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=40, help="step mode: timed rounds")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--word-vectors", default="glove")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--lambda-cls", type=float, default=0.1, help="weight of the coherence loss (paper: 0.1)")
    p.add_argument(
        "--cam-hidden",
        type=int,
        default=0,
        help="a ReLU layer of this width in the CAM (TrainConfig.cam_hidden; 0 = the paper's linear CAM)",
    )
    p.add_argument(
        "--state-subsets",
        action="store_true",
        help="also score test queries whose object shows the state it had in training apart from "
        "those in the other state (for `synth-coherence --train-states one` corpora)",
    )
    return p.parse_args(argv)


def load(data: str, word_vectors: str, seed: int):
    """(manifest, train paths, {split: table}, vocabulary, embeddings, feature stats)."""
    from schemas.manifest import Manifest
    from schemas.shards import read_table
    from training.data import features_of
    from training.text import Vocabulary, embedding_matrix

    manifest = Manifest.read(data)
    cols = ["doc_id", "sentences", "images", "links", "metadata"]
    paths = {s: [str(p) for p in manifest.shard_paths(data, s)] for s in ("train", "val", "test")}
    tables = {s: read_table(p, columns=cols).sort_by("doc_id") for s, p in paths.items()}
    vocab = Vocabulary.build([x for d in tables["train"].column("sentences").to_pylist() for x in d], 5)
    emb, _ = embedding_matrix(vocab, word_vectors, seed=seed)
    feats = np.concatenate(features_of(tables["train"])[0])
    return manifest, paths["train"], tables, vocab, emb, (feats.mean(0), feats.std(0))


def make_model(
    objective: str,
    manifest,
    train_paths,
    vocab,
    emb,
    stats,
    seed: int,
    cam_hidden: int = 0,
    lambda_cls: float = 0.1,
):
    from training.config import TrainConfig
    from training.retrieval.objective import build, model_config

    name, _, relation = objective.partition(":")
    cfg = TrainConfig(
        objective=name, relation=relation, data="-", seed=seed, lambda_cls=lambda_cls, cam_hidden=cam_hidden
    )
    torch.manual_seed(seed)
    model = build(model_config(cfg, manifest, len(vocab), emb.shape[1], train_paths), emb, stats)
    return cfg, model


def batches_of(table, vocab, size: int, rng, device):
    from training.data import make_batch

    order = rng.permutation(table.num_rows) if rng is not None else np.arange(table.num_rows)
    out = []
    for start in range(0, len(order) - 1, size):
        idx = order[start : start + size]
        if len(idx) < 2:
            continue
        b = make_batch(table.take(idx), vocab, 20)
        b.tokens, b.features = b.tokens.to(device), b.features.to(device)
        out.append(b)
    return out


def step_mode(args, manifest, train_paths, tables, vocab, emb, stats) -> dict:
    from training.retrieval.objective import model_loss

    device = torch.device(args.device)
    batch = batches_of(tables["train"].slice(0, args.batch), vocab, args.batch, None, device)[0]
    runs = {}
    for obj in args.objectives.split(","):
        cfg, model = make_model(
            obj, manifest, train_paths, vocab, emb, stats, args.seed, args.cam_hidden, args.lambda_cls
        )
        model.to(device).train()
        runs[obj] = (cfg, model, torch.optim.Adam(model.parameters(), lr=args.lr), [])

    def step(cfg, model, opt):
        loss, _ = model_loss(model, batch, cfg)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):  # warm-up
        for cfg, model, opt, _ in runs.values():
            step(cfg, model, opt)
    for r in range(args.steps):
        order = list(runs.values()) if r % 2 == 0 else list(runs.values())[::-1]
        for cfg, model, opt, times in order:
            t = time.perf_counter()
            step(cfg, model, opt)
            times.append(time.perf_counter() - t)
    med = {obj: float(np.median(v[3])) for obj, v in runs.items()}
    out = {"median_step_s": med, "steps": args.steps, "batch": args.batch}
    if "cmca" in med and "cmcm" in med:
        out["ratio_cmcm_over_cmca"] = med["cmcm"] / med["cmca"]
    return out


def train_mode(args, manifest, train_paths, tables, vocab, emb, stats) -> dict:
    from training.retrieval.objective import evaluate_pairs, model_loss, tune_refinement, val_metrics

    device = torch.device(args.device)
    val = batches_of(tables["val"], vocab, args.batch, None, device)
    test = batches_of(tables["test"], vocab, args.batch, None, device)
    results = {}
    for obj in args.objectives.split(","):
        cfg, model = make_model(
            obj, manifest, train_paths, vocab, emb, stats, args.seed, args.cam_hidden, args.lambda_cls
        )
        model.to(device)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        best, best_medr, history, t0, steps = None, float("inf"), [], time.perf_counter(), 0
        for epoch in range(args.epochs):
            model.train()
            torch.manual_seed(args.seed * 1000 + epoch)
            losses = []
            for b in batches_of(
                tables["train"], vocab, args.batch, np.random.default_rng([args.seed, epoch]), device
            ):
                loss, _ = model_loss(model, b, cfg, epoch=epoch)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
                steps += 1
            model.eval()
            v = val_metrics(model, val, cfg)
            history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), **v})
            print(json.dumps({"objective": obj, **history[-1]}), file=sys.stderr)
            if v["val_medr"] < best_medr:
                best_medr, best = v["val_medr"], (epoch, copy.deepcopy(model.state_dict()))
        train_s = time.perf_counter() - t0
        model.load_state_dict(best[1])
        model.cpu()
        tuned = tune_refinement(model, [_cpu(b) for b in val], cfg)
        scores = evaluate_pairs(model, [_cpu(b) for b in test], cfg, list(manifest.relations or []), tuned)
        if args.state_subsets:
            scores["state_subsets"] = state_subsets(model, test, tables["train"], cfg)
        results[obj] = {
            "best_epoch": best[0],
            "best_val_medr": best_medr,
            "train_s": train_s,
            "s_per_step": train_s / max(steps, 1),
            "test": scores,
            "history": history,
        }
    return results


def _object_state(meta) -> tuple[str, bool]:
    meta = dict(meta or {})
    return meta.get("object", ""), "Action" in meta.get("relations", "").split(",")


def state_subsets(model, test, train_table, cfg) -> dict:
    """Text-to-image metrics of the test queries in a state their object had in training ("seen
    state") and of the others ("unseen state"), each ranked against the whole pool."""
    from training.ranking import retrieval_metrics
    from training.retrieval.objective import encode_pairs

    seen = {_object_state(m) for m in train_table.column("metadata").to_pylist()}
    with torch.no_grad():
        s, v, _ = encode_pairs(model, [_cpu(b) for b in test])
    known = np.asarray([_object_state(m) in seen for b in test for m in b.metadata])
    labels = np.stack([known, ~known], axis=1).astype(int)
    common = {"pool_size": cfg.pool_size, "n_pools": cfg.n_pools, "seed": cfg.seed}
    out = retrieval_metrics((s @ v.T).numpy(), labels=labels, relation_names=["seen", "unseen"], **common)
    return {**out["relations"], "counts": {"seen": int(known.sum()), "unseen": int((~known).sum())}}


def _cpu(b):
    b.tokens, b.features = b.tokens.cpu(), b.features.cpu()
    return b


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load(args.data, args.word_vectors, args.seed)
    t = time.perf_counter()
    result = (step_mode if args.mode == "step" else train_mode)(args, *loaded)
    manifest, _, tables = loaded[0], loaded[1], loaded[2]
    print(
        json.dumps(
            {
                "benchmark": f"retrieval_{args.mode}",
                "dataset": manifest.dataset_version,
                "pairs": {s: t.num_rows for s, t in tables.items()},
                "config": vars(args),
                "result": result,
                "wall_s": time.perf_counter() - t,
                "host": {"python": platform.python_version(), "torch": torch.__version__, "cpus": _cpus()},
            },
            indent=1,
        )
    )


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    main()
