"""The ``news`` objective in the training stack: what ``--objective news`` plugs into the
objective and backbone registries (training/objectives/registry.py, training/backbone.py), the
Ray Train loop and the experiment.

- Data: news samples (``schemas/news.py``: one image, its present sources as sentences), built
  by ``--source news-jsonl``. ``--news-sources`` picks the sources the model reads (one: a
  single-source model; several: fused by ``--fusion``).
- Training: ``--news-loss`` (vse, vsepp, hal; order = ORDER on order embeddings) on the in-batch
  score matrix (``NewsRetrieval.score``: cosines, or ORDER's negative order violations);
  ``--news-encoder chain`` reads characters instead of word vectors (CHAIN); ``--random-drop p``
  (paper: 0.3): per sample one random present source is always kept and every other one is
  dropped with probability p; validation and test use the complete inputs. Samples with no
  source left (say a caption-only model on an article without caption) leave the loss.
- Recipes (``training/news/recipes.py``): one-for-all freezes the aligned word vectors,
  all-for-one and divide and conquer start from other checkpoints (``--init-from``); for the
  first ``--fuser-warmup-epochs`` epochs only the fuser trains.
- Validation: text-to-image MedR and R@10 over every validation sample (``val_medr``, the
  checkpoint choice, and ``val_r10``).
- Test: the retrieval family's evaluation (R@1/5/10 and MedR both directions, pools of
  ``--pool-size``): ``NewsRetrieval`` answers it as a model without coherence module. A sample
  without any source the model reads gets a zero text vector, so it counts as a miss (ties are
  pessimistic).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from schemas.news import parse_sources
from training.news.losses import news_loss
from training.news.model import NewsConfig, NewsRetrieval, sentence_slots
from training.retrieval.metrics import retrieval_metrics

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig

COLUMNS = ("metadata",)


def model_config(cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
    """The backbone registry's config builder for the ``news`` backbone. The vocabulary's words
    (for the subword n-gram table) are rebuilt exactly as the driver builds them."""
    words: list[str] = []
    if cfg.subword_buckets or cfg.news_encoder == "chain":
        from schemas.shards import read_table
        from training.text import Vocabulary

        sentences = (
            s
            for p in train_paths
            for doc in read_table([p], columns=["sentences"]).column("sentences").to_pylist()
            for s in doc
        )
        words = Vocabulary.build(sentences, cfg.min_word_count).words
        if len(words) != vocab_size:  # pragma: no cover - the driver builds the same vocabulary
            raise RuntimeError("the news model's vocabulary differs from the driver's")
    out = NewsConfig(
        vocab_size=vocab_size,
        word_dim=word_dim,
        image_dim=manifest.feature_extractor.dim,
        d=cfg.d_shared,
        d_hidden=2 * cfg.d_shared,
        heads=cfg.news_heads,
        sources=parse_sources(cfg.news_sources),
        fusion=cfg.fusion,
        subword_buckets=cfg.subword_buckets,
        words=words,
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
    if net.training and cfg.random_drop > 0:
        keep = random_drop(presence(batch, net.cfg.sources), cfg.random_drop, generator)
        keep = keep.to(batch.tokens.device)
    warmup = net.training and epoch is not None and epoch < cfg.fuser_warmup_epochs
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
    net = _net(model)
    s, v = encode_samples(net, batches)
    if len(s) < 2:
        return {"val_medr": float("nan"), "val_r10": float("nan")}
    out = retrieval_metrics(
        net.score(s, v).numpy(), pool_size=cfg.pool_size, n_pools=cfg.n_pools, seed=cfg.seed
    )
    return {"val_medr": out["t2i"]["medr"], "val_r10": out["t2i"]["r10"]}


def evaluate_samples(net: NewsRetrieval, batches, cfg: TrainConfig, subset: np.ndarray | None = None) -> dict:
    """R@1/5/10 and MedR both directions over the samples of ``batches`` (``subset``: a boolean
    mask of the samples to keep, e.g. the complete articles)."""
    s, v = encode_samples(net, batches)
    if subset is not None:
        s, v = s[torch.as_tensor(subset)], v[torch.as_tensor(subset)]
    out = retrieval_metrics(
        net.score(s, v).numpy(), pool_size=cfg.pool_size, n_pools=cfg.n_pools, seed=cfg.seed
    )
    out["pairs"] = len(s)
    return out


def check(cfg: TrainConfig) -> list[str]:
    bad = []
    try:
        sources = parse_sources(cfg.news_sources)
    except ValueError as exc:
        return [f"news_sources ({exc})"]
    if len(sources) == 1 and cfg.random_drop > 0:
        bad.append("random_drop (a single-source model has nothing to drop)")
    if cfg.select_by == "val_within":
        bad.append("select_by (val_within measures inside documents: val_medr or val_loss)")
    return bad
