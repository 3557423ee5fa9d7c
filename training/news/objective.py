"""The ``news`` objective in the training stack: what ``--objective news`` plugs into the
registries, the loop and the experiment (options and recipes: docs/retrieval-news.md).

A sample whose sources were all dropped leaves the loss; one without any source the model reads
gets a zero text vector, so it counts as a miss (ties are pessimistic)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from schemas.news import parse_sources, parse_token_limits, sources_of
from schemas.text import first_tokens
from training.news import AUTO_SUBWORD_BUCKETS, DEFAULT_NEWS_MAX_TOKENS
from training.news.config import drop_rate, warmup_epochs
from training.news.losses import news_loss
from training.news.model import NewsConfig, NewsRetrieval, sentence_slots
from training.ranking import retrieval_metrics

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig

COLUMNS = ("metadata",)
log = logging.getLogger(__name__)


def subword_buckets(cfg: TrainConfig) -> int:
    """``--subword-buckets`` resolved: -1 (auto) is the ``--init-from`` model's own (its n-gram
    table is copied, so it must match), else ``AUTO_SUBWORD_BUCKETS`` for the word encoder, 0 for
    CHAIN (characters, no word vectors) and one-for-all (frozen aligned vectors)."""
    if cfg.subword_buckets >= 0:
        return cfg.subword_buckets
    inherited = init_subword_buckets(cfg.init_from)
    if inherited is not None:
        return inherited
    return 0 if cfg.news_encoder == "chain" or cfg.multilingual == "one-for-all" else AUTO_SUBWORD_BUCKETS


def init_subword_buckets(init_from: str) -> int | None:
    """The subword buckets of the first ``--init-from`` checkpoint (0 for one from before
    subwords); None without one or when its ``meta.json`` is not readable here (``apply_init``
    reports that, with the path)."""
    import json
    from pathlib import Path

    from training.news.recipes import parse_init

    if not init_from.strip():
        return None
    try:
        first = next(iter(parse_init(init_from).values()))
        meta = json.loads((Path(first) / "meta.json").read_text())
    except (ValueError, OSError):
        return None
    return int(meta.get("model", {}).get("subword_buckets", 0))


def token_limits(cfg: TrainConfig) -> dict[str, int]:
    """Tokens kept per source: the defaults with ``--news-max-tokens`` over them."""
    return {**parse_token_limits(DEFAULT_NEWS_MAX_TOKENS), **parse_token_limits(cfg.news_max_tokens)}


def count_cuts(sentences, metadata, limits: dict[str, int]) -> dict[str, list[int]]:
    """{source: [texts longer than its limit, texts]} over the training samples (a sample's
    sentences are its present sources, in ``news_sources`` order)."""
    out = {s: [0, 0] for s in limits}
    for doc, meta in zip(sentences, metadata, strict=True):
        for name, text in zip(sources_of(dict(meta or [])), doc, strict=False):
            if name in out:
                out[name][1] += 1
                out[name][0] += len(first_tokens(text, limits[name] + 1)) > limits[name]
    return out


def truncation_warning(truncated: dict[str, list[int]]) -> str | None:
    """One line naming every source whose training texts were cut, with the counts; None if
    none was (the training report and the MLflow run show it)."""
    cut = [f"{n:,} of {total:,} {name} texts" for name, (n, total) in truncated.items() if n]
    if not cut:
        return None
    return f"news text cut to --news-max-tokens in training: {', '.join(cut)}"


def model_config(cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
    """The backbone registry's config builder for the ``news`` backbone. The vocabulary's words
    are rebuilt exactly as the driver builds them and kept in the model config (the model
    tokenises its own text: per-source limits, n-grams of unseen words, the same in serving);
    the training texts cut by the per-source limits are counted here once and logged."""
    from schemas.shards import read_table
    from training.text import Vocabulary

    table = read_table(train_paths, columns=["sentences", "metadata"])
    docs = table.column("sentences").to_pylist()
    words = Vocabulary.build((s for doc in docs for s in doc), cfg.min_word_count).words
    if len(words) != vocab_size:  # pragma: no cover - the driver builds the same vocabulary
        raise RuntimeError("the news model's vocabulary differs from the driver's")
    limits = token_limits(cfg)
    truncated = count_cuts(docs, table.column("metadata").to_pylist(), limits)
    warning = truncation_warning(truncated)
    if warning:
        log.warning("%s", warning)
    out = NewsConfig(
        vocab_size=vocab_size,
        word_dim=word_dim,
        image_dim=manifest.feature_extractor.dim,
        d=cfg.d_shared,
        d_hidden=2 * cfg.d_shared,
        heads=cfg.news_heads,
        sources=parse_sources(cfg.news_sources),
        fusion=cfg.fusion,
        subword_buckets=subword_buckets(cfg),
        subword_pooling=cfg.subword_pooling,
        words=words,
        max_tokens=limits,
        truncated=truncated,
        image_dropout=cfg.image_dropout,
        encoder=cfg.news_encoder,
        score="order" if cfg.news_loss == "order" else "cosine",
    ).to_dict()
    if cfg.multilingual != "none" or cfg.init_from:
        out["recipe"] = {"multilingual": cfg.multilingual, "init_from": absolute_init(cfg.init_from)}
    return out


def absolute_init(init_from: str) -> str:
    """``--init-from`` with absolute paths: Ray workers run in another directory."""
    from pathlib import Path

    from training.news.recipes import parse_init

    plan = parse_init(init_from)
    paths = {k: str(Path(v).resolve()) if "://" not in v else v for k, v in plan.items()}
    return paths.get("", "") or ",".join(f"{k}={v}" for k, v in paths.items())


def build(model_cfg: dict, embeddings=None, feature_stats=None) -> NewsRetrieval:
    """The model of ``model_cfg``; its ``recipe`` (``training/news/recipes.py``) loads
    ``init_from`` into a training run's fresh model (``embeddings`` given; a checkpoint read back
    brings its own weights) and freezes the aligned word vectors of one-for-all."""
    cfg = dict(model_cfg)
    recipe = cfg.pop("recipe", None) or {}
    net = NewsRetrieval(NewsConfig(**cfg), embeddings, feature_stats)
    if embeddings is not None and recipe.get("init_from"):
        from training.news.recipes import apply_init

        apply_init(net, recipe["init_from"], same_vocabulary=recipe.get("multilingual") != "all-for-one")
    if recipe.get("multilingual") == "one-for-all":
        net.embed.words.weight.requires_grad_(False)
    return net


def _net(model) -> NewsRetrieval:
    return getattr(model, "module", model)  # DDP wraps the module


def presence(batch, sources: tuple[str, ...]) -> torch.Tensor:
    """[B, S] bool: which of ``sources`` each sample of the batch has."""
    slots, rows = sentence_slots(batch.metadata, batch.n_sentences, sources)
    known = slots >= 0
    out = torch.zeros(len(batch), len(sources), dtype=torch.bool)
    out[rows[known], slots[known]] = True
    return out


def random_drop(present: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """present [B, S] -> keep [B, S]: one uniformly chosen present source per sample is kept,
    every other present source is kept with probability 1 - p (Liu et al. Sect. 6.2)."""
    B, S = present.shape
    u = torch.rand(B, S, generator=generator)
    # the kept one: argmax of random scores over the present sources
    chosen = torch.rand(B, S, generator=generator).masked_fill(~present, -1.0).argmax(1)
    keep = present & (u >= p)
    keep[torch.arange(B), chosen] |= present[torch.arange(B), chosen]
    return keep


def model_loss(
    model, batch, cfg: TrainConfig, generator=None, epoch: int | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """The configured loss on a batch of B samples (through the model's forward, so DDP syncs
    the gradients); random_drop only while the model is training."""
    net = _net(model)
    keep = None
    rate = drop_rate(cfg)
    if net.training and rate > 0:
        keep = random_drop(presence(batch, net.cfg.sources), rate, generator)
        keep = keep.to(batch.tokens.device)
    warmup = net.training and epoch is not None and epoch < warmup_epochs(cfg)
    s, v = model(batch, keep=keep, fuser_only=warmup)
    some = s.detach().norm(dim=1) > 0  # samples with a source left
    if int(some.sum()) < 2:
        zero = (s.sum() + v.sum()) * 0.0  # keeps every parameter in the graph (DDP)
        return zero, {"ret": 0.0}
    sim = net.score(s[some], v[some])
    loss = news_loss(cfg.news_loss, sim, cfg.margin)
    return loss, {"ret": float(loss.detach())}


@torch.no_grad()
def encode_samples(net: NewsRetrieval, batches) -> tuple[torch.Tensor, torch.Tensor]:
    """(texts [M, d], images [M, d]) of every sample of ``batches``, complete inputs."""
    net.eval()
    ss, vs = [], []
    for b in batches:
        s, v = net(b)
        ss.append(s.float().cpu())
        vs.append(v.float().cpu())
    return torch.cat(ss), torch.cat(vs)


def val_metrics(model, batches, cfg: TrainConfig) -> dict[str, float]:
    """val_medr and val_r10 (text-to-image) over every validation sample."""
    out = evaluate_samples(_net(model), batches, cfg)
    if out is None:
        return {"val_medr": float("nan"), "val_r10": float("nan")}
    return {"val_medr": out["t2i"]["medr"], "val_r10": out["t2i"]["r10"]}


def evaluate_samples(
    net: NewsRetrieval, batches, cfg: TrainConfig, subset: np.ndarray | None = None
) -> dict | None:
    """R@1/5/10 and MedR both directions over the samples of ``batches`` (``subset``: a boolean
    mask of the samples to keep, e.g. the complete articles); None under two samples."""
    s, v = encode_samples(net, batches)
    if subset is not None:
        s, v = s[torch.as_tensor(subset)], v[torch.as_tensor(subset)]
    if len(s) < 2:
        return None
    out = retrieval_metrics(
        net.score(s, v).numpy(), pool_size=cfg.pool_size, n_pools=cfg.n_pools, seed=cfg.seed
    )
    out["pairs"] = len(s)
    return out
