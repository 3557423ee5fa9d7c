"""The query bank of a coherence retrieval model: training captions' embeddings kept with the
model, so an image's score is its cosine minus its soft-maximum cosine to them.

Why (querybank normalisation, Bogolin et al. CVPR 2022): hardest-negative training leaves hub
images near many captions, crowding queries they do not answer; the term ranks an image by how
much better it fits this text than texts in general. Text -> image only, drawn from the training
split and packaged in the model's state (issue #45: MedR ~8 -> 7, docs/benchmarks.md)."""

from __future__ import annotations

import numpy as np
import torch

from training.data import encode_sentences
from training.text import Vocabulary

ENCODE_CHUNK = 512  # captions per forward of the text encoder
SHARD_ROWS = 50_000  # documents decoded at a time while drawing the bank


def bank_captions(data, manifest, size: int, seed: int = 0) -> list[str]:
    """Up to ``size`` sentences of the training split, drawn without replacement (seeded), in
    their split order. Streamed: one pass counts the split's sentences, a second keeps the drawn
    ones, shard by shard, so only one shard's sentence column and the bank are ever in memory
    (a 1M-pair split's text is ~100 MB; the bank's is a few hundred kB)."""
    import pyarrow.compute as pc

    from schemas.shards import iter_tables

    paths = [str(p) for p in manifest.shard_paths(data, "train")]
    if size <= 0 or not paths:
        return []

    def columns():
        for table in iter_tables(paths, SHARD_ROWS, columns=["sentences"]):
            yield pc.list_flatten(table.column("sentences"))

    total = sum(len(flat) for flat in columns())
    if total <= size:
        return [s for flat in columns() for s in flat.to_pylist()]
    keep = np.sort(np.random.default_rng(seed).choice(total, size, replace=False))
    out: list[str] = []
    start = 0
    for flat in columns():
        lo, hi = np.searchsorted(keep, [start, start + len(flat)])
        if hi > lo:
            out.extend(flat.take(keep[lo:hi] - start).to_pylist())
        start += len(flat)
    return out


@torch.no_grad()
def encode_captions(net, vocab: Vocabulary, max_tokens: int, captions: list[str]) -> torch.Tensor:
    """captions -> [Q, d] unit text embeddings of ``net``'s text encoder (eval mode)."""
    net.eval()
    out = [torch.zeros(0, net.cfg.d_shared)]
    for i in range(0, len(captions), ENCODE_CHUNK):
        tokens, lengths = encode_sentences([captions[i : i + ENCODE_CHUNK]], vocab, max_tokens)
        out.append(net.text(tokens, lengths).float().cpu())
    return torch.cat(out)


def fill_query_bank(net, data, manifest, vocab: Vocabulary, max_tokens: int, seed: int = 0) -> int:
    """Fill ``net``'s query bank with ``net.cfg.query_bank`` training captions of ``data``
    (none when that is 0); the number of captions kept (0 for a model without a bank: news)."""
    if not hasattr(net, "set_query_bank"):
        return 0
    captions = bank_captions(data, manifest, int(getattr(net.cfg, "query_bank", 0)), seed)
    net.set_query_bank(encode_captions(net, vocab, max_tokens, captions))
    return len(captions)
