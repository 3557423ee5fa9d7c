"""The cross-document hinge loss with in-batch negatives (Hessel et al. 2019, Eq. 1)."""

from __future__ import annotations

import torch


def hinge(pos: torch.Tensor, neg: torch.Tensor, margin: float) -> torch.Tensor:
    return (margin - pos + neg).clamp(min=0)


def in_batch_loss(doc_sims: torch.Tensor, margin: float = 0.2, negatives: str = "hard") -> torch.Tensor:
    """``doc_sims[a, b]`` = sim(sentences of a, images of b); the diagonal holds true pairs.

    For each document: pool over the other documents of the hinge with (its sentences, their
    images) and, separately, with (their sentences, its images); hard = max, mean = mean.
    """
    B = doc_sims.shape[0]
    if B < 2:
        raise ValueError("in-batch negatives need at least 2 documents per batch")
    pos = doc_sims.diagonal()
    off = ~torch.eye(B, dtype=torch.bool, device=doc_sims.device)
    wrong_images = hinge(pos[:, None], doc_sims, margin)  # row a: S_a vs V_b
    wrong_texts = hinge(pos[None, :], doc_sims, margin)  # column b: S_a vs V_b
    if negatives == "hard":
        pooled = wrong_images.masked_fill(~off, 0).amax(1) + wrong_texts.masked_fill(~off, 0).amax(0)
    elif negatives == "mean":
        pooled = ((wrong_images * off).sum(1) + (wrong_texts * off).sum(0)) / (B - 1)
    else:
        raise ValueError(f"negatives must be 'hard' or 'mean', not {negatives!r}")
    return pooled.mean()
