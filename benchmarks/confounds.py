"""The confounds ablation: what makes a linking model learn *inside* documents that have a style.

Writes a synthetic corpus whose documents each share a visual style (all images) and topic words
(all sentences), builds it with the real Beam build, then trains one model per row, changing one
thing at a time from the base row, and scores each on the test split (AUC, p@1, p@5). Prints one
JSON object; ``docs/benchmarks.md`` ("Confounded documents") holds the table and the command.

The rows train in this process with the real training loop (``training.loop``: the same
``train_epoch`` / ``validate_epoch`` / checkpoint choice by validation loss that Ray Train runs
in each worker), without starting Ray: one process per row would add Ray's start-up to every
row and change nothing the table compares.

    python benchmarks/confounds.py --out /tmp/confounds --rows base,pool-mean
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# One change per row against "base" (the demo's settings before the confounds fix, issue #15).
BASE = dict(
    objective="ap",
    lr=1e-3,
    d_multi=256,
    epochs=8,
    batch_docs=11,
    min_word_count=1,
    seed=0,
    text_pooling="last",
    select_by="val_loss",
    image_centring="none",  # issue #33's image-side changes postdate this table
    negatives_warmup=0,
)
ROWS: dict[str, dict] = {
    "base": {},
    # the simplest model beside every row (issue #44): hard negatives from the first step, last epoch
    "bag": {"backbone": "bag", "negatives_warmup": 0, "select_by": "last"},
    "pool-mean": {"text_pooling": "mean"},
    "pool-max": {"text_pooling": "max"},
    "pool-bigru": {"text_pooling": "bigru"},
    "pool-bag": {"text_pooling": "bag"},
    "words-random": {"word_vectors": "random"},
    "image-dropout-0": {"image_dropout": 0.0},
    "d_multi-64": {"d_multi": 64},
    "d_multi-1024": {"d_multi": 1024},
    "batch-32": {"batch_docs": 32},
    "batch-4": {"batch_docs": 4},
    "negatives-mean": {"negatives": "mean"},
    "margin-0.5": {"margin": 0.5},
    "li2021-C+I": {"objective": "li2021", "objectives": "C+I"},
    "lr-1e-4": {"lr": 1e-4},
    "select-within": {"select_by": "val_within"},
    # mmlinks' defaults after the ablation (training/config.py): both changes together
    "mmlinks-default": {"text_pooling": "max", "select_by": "val_within"},
}


class LocalShard:
    """The one method of a Ray Data shard that ``document_batches`` calls, over local Parquet."""

    def __init__(self, paths: list[str]):
        from schemas.shards import read_table
        from training.data import TRAINING_COLUMNS

        self.table = read_table(paths, columns=TRAINING_COLUMNS)

    def iter_batches(self, batch_size: int, batch_format: str = "pyarrow", prefetch_batches: int = 0):
        for start in range(0, self.table.num_rows, batch_size):
            yield self.table.slice(start, batch_size)


def write_data(
    out: Path, docs: int, style: float, topic_words: int, position: str, seed: int, image_size: int
) -> Path:
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.synthetic_corpus import SynthConfig, corpus_matches, write_corpus

    corpus, dataset = out / "corpus", out / "dataset"
    synth = SynthConfig(
        docs=docs,
        seed=seed,
        style_strength=style,
        topic_words=topic_words,
        topic_position=position,
        image_size=image_size,
    )
    if not corpus_matches(corpus, synth) or not (dataset / "manifest.json").exists():
        write_corpus(corpus, synth)
        build_dataset(BuildConfig(source="synthetic", input=str(corpus), out=str(dataset)))
    return dataset


def train_row(dataset: Path, overrides: dict, progress: bool) -> dict:
    import torch

    from training.config import TrainConfig
    from training.driver import (
        check_inputs,
        model_config,
        training_feature_stats,
        training_sentences,
    )
    from training.evaluate import evaluate
    from training.loop import (
        epoch_metrics,
        epoch_seed,
        make_worker,
        train_epoch,
        validate_epoch,
        validation_batches,
    )
    from training.text import Vocabulary, embedding_matrix

    cfg = TrainConfig(data=str(dataset), num_workers=1, **{**BASE, **overrides})
    inp = check_inputs(cfg)
    vocab = Vocabulary.build(training_sentences(inp.train_paths, False), cfg.min_word_count)
    emb, _ = embedding_matrix(vocab, cfg.word_vectors, seed=cfg.seed)
    model_cfg = model_config(cfg, inp.manifest, len(vocab), emb.shape[1], inp.train_paths)
    centred = model_cfg.get("image_centring", "none") != "none"
    config = {
        "train": cfg.to_dict(),
        "model": model_cfg,
        "vocab": vocab.words,
        "embeddings": emb,
        "feature_stats": training_feature_stats(inp.train_paths, centred=centred),
    }
    w = make_worker(config, 0, 1)
    shard = LocalShard(inp.train_paths)
    val = validation_batches(inp.val_paths, cfg.batch_docs, 0, 1)
    history, best, steps = [], None, []
    keys = ("epoch", "train_loss", "val_loss", "val_auc", "val_within")
    for epoch in range(cfg.epochs):
        seed = epoch_seed(cfg, 0, epoch)
        rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        tr = train_epoch(w, shard, epoch, rng, gen)
        m = epoch_metrics(w, epoch, tr, validate_epoch(w, val, tr["skipped"]))
        history.append({k: round(float(m[k]), 4) for k in keys})
        steps.append(m["step_s"])
        if w.state.best_epoch == epoch:  # the loop's own choice (--select-by), as Ray keeps it
            best = (epoch, copy.deepcopy(w.model.state_dict()))
        if progress:
            print(f"  epoch {epoch}: {history[-1]}", file=sys.stderr)
    w.model.load_state_dict(best[1])
    scores = evaluate(w.model, vocab, dataset, "test", max_tokens=cfg.max_tokens)
    return {
        **{k: round(v, 2) for k, v in scores["model"].items() if k != "n_docs"},
        "random_auc": round(scores["random"]["auc"], 2),
        "best_epoch": best[0],
        "epochs": cfg.epochs,
        "step_ms": round(1000 * float(np.median(steps)), 2),
        "history": history,
        "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k in {**BASE, **overrides}},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/mmlinks-confounds", help="corpus, dataset and results folder")
    ap.add_argument("--docs", type=int, default=600, help="synthetic documents (default: 600, the demo's)")
    ap.add_argument("--style-strength", type=float, default=0.8, help="document visual style (0..1)")
    ap.add_argument("--topic-words", type=int, default=3, help="topic words in every sentence")
    ap.add_argument("--topic-position", default="end", choices=("start", "end", "random"))
    ap.add_argument("--seed", type=int, default=0, help="corpus seed (training seed is BASE's)")
    ap.add_argument("--image-size", type=int, default=128, help="rendered image side in pixels")
    ap.add_argument("--rows", default="all", help=f"comma-separated rows of: {', '.join(ROWS)}")
    ap.add_argument("--set", action="append", default=[], help="override a BASE field: name=json")
    ap.add_argument("--quiet", action="store_true", help="no per-epoch lines on stderr")
    args = ap.parse_args(argv)
    for item in args.set:
        name, _, value = item.partition("=")
        BASE[name] = json.loads(value)
    names = list(ROWS) if args.rows == "all" else args.rows.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import logging

    logging.disable(logging.WARNING)  # Beam's and the build's chatter; the JSON is the output
    t0 = time.perf_counter()
    dataset = write_data(
        out, args.docs, args.style_strength, args.topic_words, args.topic_position, args.seed, args.image_size
    )
    results = {}
    for name in names:
        if not args.quiet:
            print(f"{name}: {ROWS[name]}", file=sys.stderr)
        t = time.perf_counter()
        results[name] = {**train_row(dataset, ROWS[name], not args.quiet), "seconds": 0.0}
        results[name]["seconds"] = round(time.perf_counter() - t, 1)
        if not args.quiet:
            r = results[name]
            print(f"  -> AUC {r['auc']} p@1 {r['p_at_1']} p@5 {r['p_at_5']}", file=sys.stderr)
    print(
        json.dumps(
            {
                "corpus": {
                    "docs": args.docs,
                    "style_strength": args.style_strength,
                    "topic_words": args.topic_words,
                    "topic_position": args.topic_position,
                    "seed": args.seed,
                },
                "base": BASE,
                "rows": results,
                "seconds": round(time.perf_counter() - t0, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
