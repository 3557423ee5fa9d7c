"""A trained news model for the archive benchmarks (issue #38): what ``--vectors trained`` of
``benchmarks/news_archive_index.py`` embeds its 1M / 10M archive images with, and what
``benchmarks/news_serving_latency.py --trained`` serves.

Trains one model on a built news dataset (``mmlinks data synth-news`` + ``data build --source
news-jsonl``) in one process with ``benchmarks/news_fusion.py``'s loop (Adam, batches of
``--batch``, the epoch with the best validation MedR kept): all four sources, attention fusion,
random_drop 0.3, shared dimension ``--d`` (256: the archive's), random ``--word-dim`` word
vectors. Writes ``OUT/checkpoint`` (``state.pt`` + ``meta.json``, what
``training.checkpoints.load_checkpoint_model`` reads) and ``OUT/vocab.json``, and prints its
test R@10 (text to image, the test split as one pool) as one JSON object. Example::

    PYTHONPATH=. python benchmarks/news_archive_model.py --data /tmp/a38/ds --out /tmp/a38/model
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from news_fusion import budget, prepared, run_config, train_one


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--word-dim", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from training.checkpoints import CHECKPOINT_FILE
    from training.data import make_batch
    from training.news.objective import evaluate_samples

    manifest, train_paths, train, val, test, vocab, emb, stats = prepared(args.data, args.word_dim, args.seed)
    fusion = argparse.Namespace(
        loss="vse", d=args.d, batch=args.batch, lr=1e-3, epochs=args.epochs, word_dim=args.word_dim,
        news_max_tokens="", subword_buckets=-1, seed=args.seed, fuser_warmup_epochs=0,
    )  # fmt: skip
    cfg = run_config("headline+lead+body+caption:attention:drop0.3", fusion, args.data)
    t0 = time.perf_counter()
    model, epoch, _ = train_one(cfg, manifest, train_paths, train, val, vocab, emb, stats)
    batches = [make_batch(test.slice(s, 64), vocab, budget(model)) for s in range(0, test.num_rows, 64)]
    metrics = evaluate_samples(model, batches, cfg)["t2i"]
    out = Path(args.out)
    (out / "checkpoint").mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "epoch": epoch, "val_loss": 0.0, "best_epoch": epoch}
    torch.save(state, out / "checkpoint" / CHECKPOINT_FILE)
    meta = {"model": model.cfg.to_dict(), "train": {"max_tokens": budget(model)}}
    (out / "checkpoint" / "meta.json").write_text(json.dumps(meta))
    vocab.save(out / "vocab.json")
    result = {
        "out": str(out),
        "best_epoch": epoch,
        "test_t2i": {k: metrics[k] for k in ("medr", "r1", "r5", "r10")},
        "test_samples": test.num_rows,
        "seconds": round(time.perf_counter() - t0, 1),
        "load_1min": os.getloadavg()[0],
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
