"""AP on a MiniLM text tower vs AP on the GRU with GloVe (issue #20): same data, same epochs,
same batches; test AUC / p@1 / p@5 and the mean training step time side by side.

In-process (no Ray), so the step time is the model's: the GRU and the MiniLM heads train under
the same loop, objective and learning rate. Prints one JSON object.

    python benchmarks/pretrained_towers.py --data data/ds --epochs 5 --tuning heads
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from schemas.manifest import Manifest
from schemas.shards import read_table
from training.backbone import build_model, get_backbone
from training.config import TrainConfig
from training.data import TRAINING_COLUMNS, drop_empty, make_batch
from training.driver import training_feature_stats
from training.loop import link_scores
from training.metrics import document_metrics, summarize
from training.objectives.registry import objective_loss
from training.text import Vocabulary, embedding_matrix


def _split(data: str, split: str):
    m = Manifest.read(data)
    return drop_empty(read_table(m.shard_paths(data, split), columns=TRAINING_COLUMNS).sort_by("doc_id"))[0]


def run(cfg: TrainConfig, train, test) -> dict:
    manifest = Manifest.read(cfg.data)
    paths = manifest.shard_paths(cfg.data, "train")
    sentences = [s for d in train.column("sentences").to_pylist() for s in d]
    vocab = Vocabulary.build(sentences, cfg.min_word_count)
    emb, _ = embedding_matrix(vocab, cfg.word_vectors, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    model_cfg = get_backbone(cfg.backbone).model_config(cfg, manifest, len(vocab), emb.shape[1], paths)
    model = build_model(model_cfg, emb, training_feature_stats(paths))
    build_s = time.perf_counter() - t0
    groups = model.param_groups(cfg.lr) if hasattr(model, "param_groups") else model.parameters()
    opt = torch.optim.Adam(groups, lr=cfg.lr)
    steps, step_time = 0, 0.0
    for epoch in range(cfg.epochs):
        rng = np.random.default_rng([cfg.seed, epoch])
        order = train.take(rng.permutation(train.num_rows))
        model.train()
        for start in range(0, order.num_rows - 1, cfg.batch_docs):
            batch = make_batch(order.slice(start, cfg.batch_docs), vocab, cfg.max_tokens, rng)
            if len(batch) < 2:
                continue
            t = time.perf_counter()
            loss, _ = objective_loss(model, batch, cfg, torch.Generator().manual_seed(steps))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step_time += time.perf_counter() - t
            steps += 1
    model.eval()
    per_doc = []
    with torch.no_grad():
        for start in range(0, test.num_rows, 32):
            batch = make_batch(test.slice(start, 32), vocab, cfg.max_tokens)
            for d, s, lk in zip(batch.doc_ids, link_scores(model, batch), batch.links, strict=True):
                m = document_metrics(d, s, lk)
                if m is not None:
                    per_doc.append(m)
    return {
        "backbone": cfg.backbone,
        "tuning": cfg.tower_tuning if cfg.backbone != "gru" else "all (GloVe init)",
        **summarize(per_doc),
        "steps": steps,
        "step_ms": 1000 * step_time / max(steps, 1),
        "build_s": build_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--tuning", default="heads", choices=("frozen", "heads", "last-blocks"))
    ap.add_argument("--d-multi", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train, test = _split(args.data, "train"), _split(args.data, "test")
    rows = []
    for backbone in ("gru", "minilm"):
        cfg = TrainConfig(
            data=args.data,
            objective="ap",
            backbone=backbone,
            tower_tuning=args.tuning,
            epochs=args.epochs,
            d_multi=args.d_multi,
            lr=args.lr,
            min_word_count=1,
        )
        rows.append(run(cfg, train, test))
    load = os.getloadavg()[0]
    print(json.dumps({"data": args.data, "epochs": args.epochs, "load_1min": load, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
