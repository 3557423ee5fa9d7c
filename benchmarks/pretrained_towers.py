"""AP on a MiniLM text tower vs AP on the GRU with GloVe (issue #20): same data, same epochs,
same batches; test AUC / p@1 / p@5, the training time and the mean step time side by side.

In-process (no Ray), so the times are the model's: the GRU and the MiniLM towers train under
the same loop, objective and learning rate. ``--data`` names a built dataset; without it,
``--docs N`` writes a synthetic corpus of N documents and builds it with Beam (default
extractor) under ``--workdir`` first (reused when already there). Prints one JSON object.

    python benchmarks/pretrained_towers.py --data data/ds --epochs 5 --tuning heads
    python benchmarks/pretrained_towers.py --docs 400 --workdir /tmp/towers --epochs 3 --tuning heads,frozen
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

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
    t_train = time.perf_counter()
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
    train_s = time.perf_counter() - t_train  # batching included: the whole training time
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
        "train_s": train_s,
        "step_ms": 1000 * step_time / max(steps, 1),
        "build_s": build_s,
        "load_1min_after": os.getloadavg()[0],
    }


def synthetic_dataset(workdir: Path, docs: int, seed: int) -> str:
    """A synthetic corpus of ``docs`` documents built as ``mmlinks data synth`` + ``data build``
    do (Beam, default extractor), reused when ``workdir`` already holds it."""
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.synthetic_corpus import SynthConfig, corpus_matches, write_corpus

    corpus, out = workdir / f"corpus-{docs}-{seed}", workdir / f"ds-{docs}-{seed}"
    synth = SynthConfig(docs=docs, seed=seed)
    if not corpus_matches(corpus, synth):
        write_corpus(corpus, synth)
    if not (out / "manifest.json").is_file():
        build_dataset(BuildConfig(source="synthetic", input=str(corpus), out=str(out)))
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="a built dataset (default: build --docs synthetic documents)")
    ap.add_argument("--docs", type=int, default=400, help="synthetic documents when no --data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="pretrained-towers-bench", help="where --docs builds")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--tuning", default="heads", help="comma list of frozen, heads, last-blocks")
    ap.add_argument("--d-multi", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    data = args.data or synthetic_dataset(Path(args.workdir), args.docs, args.seed)
    data_s = time.perf_counter() - t0
    train, test = _split(data, "train"), _split(data, "test")
    labelled = sum(1 for links in test.column("links").to_pylist() if links)
    rows = []
    runs = [("gru", "heads")] + [("minilm", t) for t in args.tuning.split(",")]
    for backbone, tuning in runs:
        cfg = TrainConfig(
            data=data,
            objective="ap",
            backbone=backbone,
            tower_tuning=tuning,
            epochs=args.epochs,
            d_multi=args.d_multi,
            lr=args.lr,
            min_word_count=1,
        )
        rows.append(run(cfg, train, test))
    out = {
        "data": data,
        "data_s": data_s,
        "docs": {"train": train.num_rows, "test": test.num_rows, "test_labelled": labelled},
        "epochs": args.epochs,
        "threads": args.threads,
        "load_1min": os.getloadavg()[0],
        "rows": rows,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
