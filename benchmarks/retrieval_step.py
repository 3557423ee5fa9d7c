"""Coherence retrieval (issue #17): the time of one training step of CMCA and of CMCM, in one process.

One JSON object on stdout: the step (forward, loss, backward, Adam) of each ``--objectives`` entry
on the same batch, alternated round by round so that load drifts hit both alike; the ratio
CMCM / CMCA of the medians (target <= 1.2).

It uses the library's model and loss (training/retrieval/) and reads the shards with pyarrow; no
Ray, MLflow or Beam. Example::

    PYTHONPATH=. python benchmarks/retrieval_step.py --data DS --mode step --steps 60

``--mode train`` (CMCM vs CMCA trained from the same seed in a bare Adam loop, test MedR and R@K
with refinement, ``--state-subsets``) measured issue #17's comparison; its verdict is in
docs/benchmarks.md, "Coherence retrieval", and issue #61 retired it (the last version: commit
714325c). ``mmlinks train`` and ``benchmarks/coherence_attributes.py`` train these models now.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import torch


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a pair dataset (mmlinks data synth-coherence + build)")
    p.add_argument("--mode", choices=("step",), default="step", help="the one mode left (see above)")
    p.add_argument("--objectives", default="cmca,cmcm", help="comma-separated (cmca, cmcm, cmcm-c:RELATION)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=40, help="timed rounds")
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


def step_mode(args, manifest, train_paths, tables, vocab, emb, stats) -> dict:
    from training.data import make_batch
    from training.retrieval.objective import model_loss

    device = torch.device(args.device)
    batch = make_batch(tables["train"].slice(0, args.batch), vocab, 20)
    batch.tokens, batch.features = batch.tokens.to(device), batch.features.to(device)
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


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load(args.data, args.word_vectors, args.seed)
    t = time.perf_counter()
    result = step_mode(args, *loaded)
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
                "host": {
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "cpus": os.cpu_count(),
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
