"""The bidirectional in-batch losses of Liu et al.'s Table 1 (Sect. 4.1 and 6.1.1). Pure torch.

All take S [B, B] (text i x image j; pair i matched). ``vse`` (Eq. 1): the sum of hinges over
every in-batch negative, both ways, the paper's choice for weak labels; ``vsepp`` (Eq. 4): the
hardest negative; ``hal`` (Eq. 5, a = 20, b = 30, e = 0.2; S_ii is clamped above -1/b, our
assumption, where log(1 + b S_ii) is undefined); ``order`` (Vendrov et al. 2016): non-negative
embeddings, image a specialisation of its text, scored by ``S = -||max(0, text - image)||^2``
(``order_scores``) under ``vse``'s hinges."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.joint_space import hardest_triplet_loss
from training.news import LOSSES

HAL_ALPHA, HAL_BETA, HAL_EPS = 20.0, 30.0, 0.2


def _off_diagonal(B: int, device) -> torch.Tensor:
    return ~torch.eye(B, dtype=torch.bool, device=device)


def vse_loss(sim: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """sim [B, B] -> the sum-of-hinges loss over all in-batch negatives (both directions)."""
    pos = sim.diagonal()
    off = _off_diagonal(sim.shape[0], sim.device)
    per_text = (F.relu(margin - pos[:, None] + sim) * off).sum(1)  # text i vs image j
    per_image = (F.relu(margin - pos[None, :] + sim) * off).sum(0)  # image i vs text j
    return (per_text + per_image).mean()


def vsepp_loss(sim: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """sim [B, B] -> the hardest-negative loss (both directions)."""
    B = sim.shape[0]
    # hardest_triplet_loss takes unit vectors; the identity image basis gives back ``sim``
    return hardest_triplet_loss(sim, torch.eye(B, dtype=sim.dtype, device=sim.device), margin)


def _log1p_sum_exp(x: torch.Tensor, keep: torch.Tensor, dim: int) -> torch.Tensor:
    """log(1 + sum over ``keep`` of exp(x)) along ``dim``, stably."""
    x = x.masked_fill(~keep, float("-inf"))
    zero = torch.zeros_like(x.narrow(dim, 0, 1))
    return torch.logsumexp(torch.cat([zero, x], dim), dim)


def hal_loss(
    sim: torch.Tensor, alpha: float = HAL_ALPHA, beta: float = HAL_BETA, eps: float = HAL_EPS
) -> torch.Tensor:
    """sim [B, B] -> Eq. 5 of Liu et al. (HAL)."""
    off = _off_diagonal(sim.shape[0], sim.device)
    z = alpha * (sim - eps)
    texts = _log1p_sum_exp(z, off, 0) / alpha  # per image i: over texts m != i (S_mi)
    images = _log1p_sum_exp(z, off, 1) / alpha  # per text i: over images n != i (S_in)
    pos = sim.diagonal().clamp(min=-1.0 / beta + 1e-4)
    return (texts + images - torch.log1p(beta * pos)).mean()


ORDER_CHUNK = 1 << 24  # elements of the [q, N, d] difference held at once
EMPTY_ORDER_SCORE = -2.0  # below every real order score (they lie in [-1, 0])


def order_scores(text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    """text [Q, d] x image [N, d] (non-negative unit vectors) -> [Q, N] =
    -||max(0, text_q - image_n)||^2, in [-1, 0] (``max(0, t - i) <= t`` for ``i >= 0``), in row
    chunks so the [q, N, d] difference stays bounded. A zero text row (a sample without any source
    the model reads) scores ``EMPTY_ORDER_SCORE`` against every image: no text, no match (a zero
    vector violates nothing and would otherwise score the best possible 0)."""
    rows = max(1, ORDER_CHUNK // max(1, image.shape[0] * image.shape[1]))
    parts = [
        -F.relu(text[i : i + rows, None, :] - image[None, :, :]).pow(2).sum(-1)
        for i in range(0, text.shape[0], rows)
    ]
    out = torch.cat(parts) if parts else text.new_zeros(0, image.shape[0])
    return out.masked_fill((text.norm(dim=1) == 0)[:, None], EMPTY_ORDER_SCORE)


def news_loss(name: str, sim: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """The loss ``name`` of the score matrix sim [B, B] (for ``order``: ``order_scores``)."""
    if sim.shape[0] < 2:
        raise ValueError("the in-batch losses need at least 2 pairs")
    if name in ("vse", "order"):  # ORDER: Vendrov's hinge over all in-batch negatives
        return vse_loss(sim, margin)
    if name == "vsepp":
        return vsepp_loss(sim, margin)
    if name == "hal":
        return hal_loss(sim)
    raise ValueError(f"unknown loss {name!r}; known: {', '.join(LOSSES)}")
