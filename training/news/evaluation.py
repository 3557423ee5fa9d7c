"""A news net scored on a split's samples (issue #18): R@K and MedR over random pools, both
directions, and each sample's rank among all of them: ``mmlinks evaluate`` of a news checkpoint,
and the promotion gate's metrics of a served news model (``models.news_serving.evaluate_news``)."""

from __future__ import annotations

import numpy as np
import torch

from schemas.errors import MmlinksError
from schemas.news import sources_of
from training.news.encode import encode_articles
from training.news.model import NewsRetrieval
from training.text import Vocabulary


def news_split_metrics(
    net: NewsRetrieval,
    vocab: Vocabulary,
    max_tokens: int,
    paths: list,
    pool_size: int,
    n_pools: int,
    seed: int = 0,
) -> dict:
    """R@1/5/10 and MedR, text-to-image ("t2i") and image-to-text ("i2t"), of a news model on
    the samples of ``paths`` (complete inputs: every present source), averaged over ``n_pools``
    random pools of ``pool_size`` samples (ties pessimistic); plus ``ranks``, each sample's
    text-to-image rank among all the samples (1 = its own image first), and ``doc_ids``."""
    from schemas.shards import read_table
    from training.data import features_of
    from training.ranking import retrieval_metrics

    if not paths:
        raise MmlinksError("news evaluation needs at least 2 samples; no shard given")
    table = read_table(paths, columns=["doc_id", "sentences", "images", "metadata"]).sort_by("doc_id")
    articles = [
        dict(zip(sources_of(dict(m or {})), s, strict=True))
        for s, m in zip(
            table.column("sentences").to_pylist(), table.column("metadata").to_pylist(), strict=True
        )
    ]
    feats, _ = features_of(table)
    if len(articles) < 2:
        raise MmlinksError("news evaluation needs at least 2 samples")
    s = encode_articles(net, vocab, max_tokens, articles)
    with torch.no_grad():
        v = net.image(torch.as_tensor(np.stack([f[0] for f in feats])))

    def score_pool(idx: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(idx)
        return net.score(s[t], v[t]).numpy()

    m = retrieval_metrics(
        n=len(articles), score_pool=score_pool, pool_size=pool_size, n_pools=n_pools, seed=seed
    )
    with torch.no_grad():
        ranks = torch.cat([_chunk_ranks(net.score(s[i : i + 1024], v), i) for i in range(0, len(s), 1024)])
    return {
        **m,
        "pairs": len(articles),
        "ranks": ranks.tolist(),
        "doc_ids": table.column("doc_id").to_pylist(),
    }


def _chunk_ranks(sim: torch.Tensor, start: int) -> torch.Tensor:
    """Rows ``start..`` of the text x image scores -> each text's rank of its own image among all
    images, pessimistic (a tied image counts as ranked above; the own image itself once)."""
    own = sim[torch.arange(len(sim)), start + torch.arange(len(sim))][:, None]
    return (sim >= own).sum(1)
