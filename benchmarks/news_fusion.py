"""News image selection (issue #18): fusion + random_drop vs the best single source, on a built
news dataset (`mmlinks data synth-news` + `data build --source news-jsonl`), in one process.

A ``--runs`` entry is ``SOURCES[:FUSION][:dropP][:subN][:poolP]``; ``dc:`` in front trains it by
divide and conquer (Liu et al. Sect. 6.2) from the single-source runs earlier in ``--runs``;
``bow`` is the bag-of-words reference (issue #34). ``--save-model OUT`` keeps the last run's
checkpoint and vocabulary for the archive benchmarks (issue #38; it replaced
``news_archive_model.py``, docs/benchmarks-news.md). ``--unseen-data DS2`` also scores on a build
whose test articles write every name in an unseen form (the subword target).

Every run trains from the same seed on the same batches with the training loop's recipe without
Ray (Adam, reshuffled batches, random_drop, the epoch with the lowest validation MedR kept)
through ``training/news/``, then scores the test split: R@1/5/10 and MedR both ways, on every
sample and on the complete ones; a sample without any source a model reads is a miss for it.
One JSON object on stdout::

    PYTHONPATH=. python benchmarks/news_fusion.py --data DS --epochs 15
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np
import torch

DEFAULT_RUNS = (
    "headline,lead,body,caption,headline+lead+body+caption:attention,"
    "headline+lead+body+caption:attention:drop0.3,headline+lead+body+caption:max:drop0.3"
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data", required=True, help="a news dataset (data synth-news + build --source news-jsonl)"
    )
    p.add_argument("--runs", default=DEFAULT_RUNS, help="comma-separated SOURCES[:FUSION][:dropP] entries")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--d", type=int, default=64, help="d_shared")
    p.add_argument("--word-dim", type=int, default=32, help="random word vectors of this size")
    p.add_argument("--loss", default="vse", choices=("vse", "vsepp", "hal"))
    p.add_argument("--news-max-tokens", default="", help="per-source token limits (default: TrainConfig's)")
    p.add_argument("--subword-buckets", type=int, default=-1, help="-1: TrainConfig's auto")
    p.add_argument("--subword-pooling", default="sum-sqrt", help="TrainConfig's; a run's :poolP overrides")
    p.add_argument("--unseen-data", default="", help="a build with unseen name forms in its test split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--fuser-warmup-epochs", type=int, default=1, help="dc: runs: epochs of fuser-only training"
    )
    p.add_argument("--save-model", default="", help="folder for the last run's model (checkpoint + vocab)")
    return p.parse_args(argv)


def run_config(entry: str, args, data: str, singles: dict | None = None):
    from training.config import TrainConfig

    dc = entry.startswith("dc:")
    parts = entry.removeprefix("dc:").split(":")
    if parts[0] == "bow":  # the reference reads every source
        parts[0] = "headline+lead+body+caption"
    fusion = next((x for x in parts[1:] if not x.startswith(("drop", "sub", "pool"))), "attention")
    drop = next((float(x[4:]) for x in parts[1:] if x.startswith("drop")), 0.0)
    buckets = next((int(x[3:]) for x in parts[1:] if x.startswith("sub")), args.subword_buckets)
    pooling = next((x[4:] for x in parts[1:] if x.startswith("pool")), args.subword_pooling)
    return TrainConfig(
        data=data,
        objective="news",
        news_sources=parts[0].replace("+", ","),
        fusion=fusion,
        random_drop=drop,
        news_loss=args.loss,
        d_shared=args.d,
        batch_docs=args.batch,
        lr=args.lr,
        epochs=args.epochs,
        min_word_count=1,
        word_vectors="random",
        news_max_tokens=args.news_max_tokens,
        subword_buckets=buckets,
        subword_pooling=pooling,
        image_dropout=0.0,
        seed=args.seed,
        pool_size=500,
        n_pools=1,
        init_from=dc_init(parts[0].split("+"), singles or {}) if dc else "",
        fuser_warmup_epochs=args.fuser_warmup_epochs if dc else 0,
    )


def dc_init(sources: list[str], singles: dict) -> str:
    """``--init-from`` of a divide-and-conquer run: SOURCE=checkpoint of each single-source run,
    the caption model first (the paper's: its word embeddings and image tower are kept)."""
    missing = [s for s in sources if s not in singles]
    if missing:
        raise SystemExit(f"dc: needs the single-source runs of {', '.join(missing)} earlier in --runs")
    order = sorted(sources, key=lambda s: s != "caption")
    return ",".join(f"{s}={singles[s]}" for s in order)


class BagOfWords(torch.nn.Module):
    """The bag-of-words reference: text = mean word vector over every token of every present
    source of a sample [B, w] -> linear -> unit [B, d]; image = the news model's image tower.
    Answers what ``model_loss``, ``val_metrics`` and ``evaluate_samples`` ask of a news model
    (``cfg.sources``, ``score``, ``forward(batch, keep, fuser_only)``); no random_drop."""

    def __init__(self, news_model):
        super().__init__()
        self.cfg = news_model.cfg
        w = news_model.embed.words
        self.words = torch.nn.EmbeddingBag(w.num_embeddings, w.embedding_dim, mode="mean", padding_idx=0)
        self.words.weight.data.copy_(w.weight.data)
        self.proj = torch.nn.Linear(w.embedding_dim, self.cfg.d)
        self.image = news_model.image

    def forward(self, batch, keep=None, fuser_only=False):
        rows = torch.repeat_interleave(torch.arange(len(batch)), torch.tensor(batch.n_sentences))
        pos = torch.cat([torch.arange(n) for n in batch.n_sentences])  # sentence index in its sample
        B, T = len(batch), batch.tokens.shape[1]
        per_doc = torch.zeros(B, int(max(batch.n_sentences)), T, dtype=torch.long)
        per_doc[rows, pos] = batch.tokens  # [B, S_max, T]; padding 0 leaves the mean
        per_doc = per_doc.flatten(1)
        text = torch.nn.functional.normalize(self.proj(self.words(per_doc)), dim=-1)
        return text, self.image(batch.features)

    def score(self, text, image):
        return text @ image.T


def save_single(folder, model, epoch: int = 0) -> str:
    """A run's best model as a checkpoint folder (what --init-from and load_checkpoint_model read)."""
    from pathlib import Path

    from training.checkpoints import CHECKPOINT_FILE

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "epoch": epoch, "val_loss": 0.0, "best_epoch": epoch}
    torch.save(state, folder / CHECKPOINT_FILE)
    meta = {"model": model.cfg.to_dict(), "train": {"max_tokens": budget(model)}}
    (folder / "meta.json").write_text(json.dumps(meta))
    return str(folder)


def load(data: str, split: str):
    from schemas.manifest import Manifest
    from schemas.shards import read_table

    manifest = Manifest.read(data)
    paths = [str(p) for p in manifest.shard_paths(data, split)]
    cols = ["doc_id", "sentences", "images", "links", "metadata"]
    return manifest, paths, read_table(paths, columns=cols).sort_by("doc_id")


def budget(model) -> int:
    """Tokens a batch keeps per sentence: the longest per-source limit (the news model cuts
    each source itself)."""
    return max(model.cfg.max_tokens.values())


def prepared(data: str, word_dim: int, seed: int) -> tuple:
    """(manifest, train shard paths, train, val, test tables, vocabulary, random word vectors,
    feature stats): what every run of a news benchmark trains and scores on."""
    from training.driver import training_feature_stats
    from training.text import Vocabulary, embedding_matrix

    manifest, train_paths, train = load(data, "train")
    _, _, val = load(data, "val")
    _, _, test = load(data, "test")
    vocab = Vocabulary.build([s for d in train.column("sentences").to_pylist() for s in d], 1)
    emb, _ = embedding_matrix(vocab, "random", dim=word_dim, seed=seed)
    return manifest, train_paths, train, val, test, vocab, emb, training_feature_stats(train_paths)


def batches(table, vocab, tokens: int) -> list:
    """A split cut into scoring batches of 64 samples, in order."""
    from training.data import make_batch

    return [make_batch(table.slice(s, 64), vocab, tokens) for s in range(0, table.num_rows, 64)]


def train_one(cfg, manifest, train_paths, train, val, vocab, emb, feats_stats, bow=False) -> tuple:
    """(best model, best epoch, history) by validation MedR."""
    from training.backbone import get_backbone
    from training.data import make_batch
    from training.news.objective import val_metrics
    from training.objectives.registry import objective_loss

    spec = get_backbone("news")
    torch.manual_seed(cfg.seed)
    model = spec.build(
        spec.model_config(cfg, manifest, len(vocab), emb.shape[1], train_paths), emb, feats_stats
    )
    if bow:
        model = BagOfWords(model)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    tokens = budget(model)
    val_batches = batches(val, vocab, tokens)
    rng, gen = np.random.default_rng(cfg.seed), torch.Generator().manual_seed(cfg.seed)
    best, history = (float("inf"), -1, None), []
    for epoch in range(cfg.epochs):
        model.train()
        order = rng.permutation(train.num_rows)
        for s in range(0, len(order) - 1, cfg.batch_docs):
            idx = order[s : s + cfg.batch_docs]
            if len(idx) < 2:
                continue
            batch = make_batch(train.take(idx), vocab, tokens)
            loss, _ = objective_loss(model, batch, cfg, gen, epoch=epoch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        m = val_metrics(model, val_batches, cfg)
        history.append({"epoch": epoch, **m})
        if m["val_medr"] < best[0]:
            best = (m["val_medr"], epoch, copy.deepcopy(model.state_dict()))
    model.load_state_dict(best[2])
    return model, best[1], history


def complete_mask(table) -> np.ndarray:
    from schemas.news import NEWS_SOURCES, sources_of

    metas = [dict(m or []) for m in table.column("metadata").to_pylist()]
    return np.array([len(sources_of(m)) == len(NEWS_SOURCES) for m in metas])


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from training.news.objective import evaluate_samples

    manifest, train_paths, train, val, test, vocab, emb, stats = prepared(args.data, args.word_dim, args.seed)
    complete = complete_mask(test)
    unseen = load(args.unseen_data, "test")[2] if args.unseen_data else None
    results, checkpoints = {}, {}
    tmp = tempfile.mkdtemp(prefix="news-fusion-")
    for entry in args.runs.split(","):
        cfg = run_config(entry, args, args.data, checkpoints)
        t0 = time.perf_counter()
        bow = entry == "bow"
        model, epoch, history = train_one(cfg, manifest, train_paths, train, val, vocab, emb, stats, bow)
        if "," not in cfg.news_sources:
            checkpoints[cfg.news_sources] = save_single(f"{tmp}/{cfg.news_sources}", model)
        test_batches = batches(test, vocab, budget(model))
        full = evaluate_samples(model, test_batches, cfg)
        sub = evaluate_samples(model, test_batches, cfg, complete)
        keep = ("medr", "r1", "r5", "r10")
        results[entry] = {
            "test_t2i": {k: full["t2i"][k] for k in keep},
            "test_i2t": {k: full["i2t"][k] for k in keep},
            "complete_t2i": {k: sub["t2i"][k] for k in keep},
            "best_epoch": epoch,
            "val_r10_last": history[-1]["val_r10"],
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if unseen is not None:
            out = evaluate_samples(model, batches(unseen, vocab, budget(model)), cfg)
            results[entry]["unseen_forms_t2i"] = {k: out["t2i"][k] for k in keep}
            results[entry]["unseen_forms_i2t"] = {k: out["i2t"][k] for k in keep}
        print(f"{entry}: {results[entry]}", file=sys.stderr)
    if args.save_model:
        save_single(f"{args.save_model}/checkpoint", model, epoch)
        vocab.save(f"{args.save_model}/vocab.json")
    singles = {k: v for k, v in results.items() if "+" not in k and k != "bow"}
    best_single = max(singles, key=lambda k: singles[k]["test_t2i"]["r10"]) if singles else None
    return {
        "benchmark": "news_fusion",
        "data": args.data,
        "samples": {
            "train": train.num_rows,
            "val": val.num_rows,
            "test": test.num_rows,
            "test_complete": int(complete.sum()),
        },
        "epochs": args.epochs,
        "loss": args.loss,
        "runs": results,
        "best_single_source": best_single,
        "load_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
