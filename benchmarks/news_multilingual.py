"""News image selection (issue #18), the multilingual recipes of Liu et al. (Sect. 5.2, Table 4)
on a built synthetic news dataset: all-for-one vs training on the target language alone (and
one-for-all beside them), in one process.

The dataset's samples are split by their ``language`` (source language A, target B). Word
vectors are the synthetic corpus's aligned ones (``pipelines.news_corpus.write_vectors``: B's
vector of a word = A's vector of its translation + noise; some B words left out), written to a
temporary folder. ``--target-train N`` keeps the first N target training samples (by id): the
low-resource case the recipe is for.

- ``target-alone``: B's vocabulary, B's aligned vectors (B's out-of-vocabulary words random),
  everything fine-tuned, on B's training samples (the paper's line 4.2, "de, full vocab").
- ``all-for-one``: step 1 one-for-all on A (A's vectors frozen, A's samples); step 2 every weight
  but the word embeddings from step 1's best epoch, B's vectors plus B's OOV words swapped in,
  fine-tuned on B's training samples (``--multilingual all-for-one --init-from``).
- ``one-for-all``: one model on A's and B's training samples mixed, both aligned vector files,
  frozen.

Each through the library's config, model, recipe (``training/news/recipes.py``), loss and
metrics, with ``benchmarks/news_fusion.py``'s loop (Adam, the epoch with the best validation
MedR on B's validation samples kept); scored on B's test samples, complete inputs, one pool.

Example::

    PYTHONPATH=. python benchmarks/news_multilingual.py --data DS --epochs 15 --target-train 150
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from news_fusion import load, run_config, train_one


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a synthetic news dataset (synth-news + build)")
    p.add_argument("--source-language", default="en")
    p.add_argument("--target-language", default="de")
    p.add_argument("--target-train", type=int, default=0, help="target training samples kept (0: all)")
    p.add_argument("--sources", default="headline+lead+body+caption:attention")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--d", type=int, default=64, help="d_shared")
    p.add_argument("--word-dim", type=int, default=32, help="aligned vector size")
    p.add_argument("--loss", default="vse", choices=("vse", "vsepp", "hal"))
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def of_language(table, lang: str):
    langs = [dict(m or []).get("language") for m in table.column("metadata").to_pylist()]
    return table.filter(pa.array([x == lang for x in langs]))


def vocab_and_vectors(tables, vectors: str, dim: int, seed: int):
    from training.text import Vocabulary, embedding_matrix

    vocab = Vocabulary.build((s for t in tables for d in t.column("sentences").to_pylist() for s in d), 1)
    emb, hit = embedding_matrix(vocab, vectors, dim=dim, seed=seed)
    return vocab, emb, hit


def save_checkpoint(folder: Path, model) -> Path:
    from training.checkpoints import CHECKPOINT_FILE

    folder.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"model": model.state_dict(), "epoch": 0, "val_loss": 0.0, "best_epoch": 0}, folder / CHECKPOINT_FILE
    )
    (folder / "meta.json").write_text(json.dumps({"model": model.cfg.to_dict()}))
    return folder


def run(name, cfg, manifest, paths, train, val, test, vocab, emb, stats) -> tuple:
    from training.data import make_batch
    from training.news.objective import evaluate_samples

    t0 = time.perf_counter()
    model, epoch, _ = train_one(cfg, manifest, paths, train, val, vocab, emb, stats)
    batches = [make_batch(test.slice(s, 64), vocab, cfg.max_tokens) for s in range(0, test.num_rows, 64)]
    out = evaluate_samples(model, batches, cfg)
    keep = ("medr", "r1", "r5", "r10")
    row = {
        "test_t2i": {k: out["t2i"][k] for k in keep},
        "test_i2t": {k: out["i2t"][k] for k in keep},
        "train_samples": train.num_rows,
        "vocabulary": len(vocab),
        "best_epoch": epoch,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(f"{name}: {row}", file=sys.stderr)
    return model, row


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from pipelines.news_corpus import write_vectors
    from training.driver import training_feature_stats

    A, B = args.source_language, args.target_language
    manifest, paths, train = load(args.data, "train")
    val, test = of_language(load(args.data, "val")[2], B), of_language(load(args.data, "test")[2], B)
    train_a, train_b = of_language(train, A), of_language(train, B)
    if args.target_train:
        train_b = train_b.slice(0, args.target_train)
    stats = training_feature_stats(paths)
    tmp = Path(tempfile.mkdtemp(prefix="news-ml-"))
    write_vectors(tmp / "vectors", args.word_dim, args.seed)
    vec = {lang: f"text:{tmp / 'vectors' / f'{lang}.vec'}" for lang in (A, B)}
    base = run_config(args.sources, args, args.data)
    results = {}

    vocab_b, emb_b, hit_b = vocab_and_vectors([train_b], vec[B], args.word_dim, args.seed)
    _, results["target-alone"] = run(
        "target-alone", base, manifest, paths, train_b, val, test, vocab_b, emb_b, stats
    )

    vocab_a, emb_a, _ = vocab_and_vectors([train_a], vec[A], args.word_dim, args.seed)
    step1 = dataclasses.replace(base, multilingual="one-for-all", word_vectors=vec[A])
    val_a = of_language(load(args.data, "val")[2], A)
    model_a, _, _ = train_one(step1, manifest, paths, train_a, val_a, vocab_a, emb_a, stats)
    ckpt = save_checkpoint(tmp / "step1", model_a)
    step2 = dataclasses.replace(base, multilingual="all-for-one", init_from=str(ckpt), word_vectors=vec[B])
    _, results["all-for-one"] = run(
        "all-for-one", step2, manifest, paths, train_b, val, test, vocab_b, emb_b, stats
    )

    both = pa.concat_tables([train_a, train_b])
    vocab_ab, emb_ab, _ = vocab_and_vectors([both], f"{vec[A]},{vec[B]}", args.word_dim, args.seed)
    ofa = dataclasses.replace(base, multilingual="one-for-all", word_vectors=f"{vec[A]},{vec[B]}")
    _, results["one-for-all"] = run(
        "one-for-all", ofa, manifest, paths, both, val, test, vocab_ab, emb_ab, stats
    )
    return {
        "benchmark": "news_multilingual",
        "data": args.data,
        "languages": {"source": A, "target": B},
        "samples": {
            "train_source": train_a.num_rows,
            "train_target": train_b.num_rows,
            "val_target": val.num_rows,
            "test_target": test.num_rows,
        },
        "target_vector_hit_rate": round(hit_b, 3),
        "sources": args.sources,
        "epochs": args.epochs,
        "loss": args.loss,
        "runs": results,
        "load_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
