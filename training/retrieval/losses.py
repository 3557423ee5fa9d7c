"""CMCA / CMCM losses (Alikhani et al. Eq. 1-3) and the selective similarity refinement
(Eq. 4-6). Pure torch.

The retrieval hinge is VSE++'s hardest negative both ways (the paper's ``min{0, trip}`` is a sign
slip), margin ``--retrieval-margin``; why a warm-up: from random weights the hardest-negative
hinge collapses the embeddings, so the first ``--hard-negative-warmup`` epochs average every
negative. Coherence is relation-weighted BCE (w_c = 1 / positive share); total = retrieval +
lambda_cls x coherence. Refinement multiplies difficult queries' scores (top-2 gap < T) by
sum_c exp(lambda |x_c - 0.5|)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from training.joint_space import MARGIN, hardest_triplet_loss, mean_triplet_loss

LAMBDA_CLS = 0.1


def relation_weights(labels: np.ndarray) -> np.ndarray:
    """[M, C] 0/1 training labels -> w_c = 1 / positive rate (a relation no training pair has
    counts as 1 / M, so its weight stays finite)."""
    labels = np.asarray(labels, dtype=np.float64)
    rate = labels.mean(0)
    return 1.0 / np.maximum(rate, 1.0 / max(len(labels), 1))


def coherence_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """logits, labels [B, C], weights [C] -> mean over pairs of sum_c w_c BCE."""
    bce = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
    return (bce * weights.to(logits.dtype)).sum(-1).mean()


def cmcm_loss(
    s: torch.Tensor,
    v: torch.Tensor,
    logits: torch.Tensor | None,
    labels: torch.Tensor | None,
    weights: torch.Tensor | None,
    margin: float = MARGIN,
    lambda_cls: float = LAMBDA_CLS,
    negatives: str = "hard",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. 3: (total, {"ret": ..., "cls": ...}); CMCA when ``logits`` is None. ``negatives``:
    "hard" = the hardest in-batch negative (the paper), "mean" = all of them (the warm-up)."""
    ret = (hardest_triplet_loss if negatives == "hard" else mean_triplet_loss)(s, v, margin)
    if logits is None:
        return ret, {"ret": float(ret.detach())}
    cls = coherence_loss(logits, labels, weights)
    return ret + lambda_cls * cls, {"ret": float(ret.detach()), "cls": float(cls.detach())}


def confidence(probs: torch.Tensor, lam: float) -> torch.Tensor:
    """[..., C] relation probabilities -> eta [...] = sum_c exp(lam |p_c - 0.5|) (Eq. 4-5)."""
    return torch.exp(lam * (probs - 0.5).abs()).sum(-1)


def selective_refinement(
    theta: torch.Tensor, probs: torch.Tensor, lam: float = 0.12, threshold: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor]:
    """theta [Q, N] similarities, probs [Q, N, C] -> (refined [Q, N], difficult [Q] bool).

    Rows whose top-1 minus top-2 similarity is below ``threshold`` become theta x eta (Eq. 6);
    the others keep theta."""
    top2 = theta.topk(2, dim=1).values
    difficult = (top2[:, 0] - top2[:, 1]) < threshold
    refined = torch.where(difficult[:, None], theta * confidence(probs, lam), theta)
    return refined, difficult
