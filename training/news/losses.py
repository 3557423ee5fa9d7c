"""The three bidirectional in-batch losses of Liu et al. (Sect. 4.1 and 6.1.1). Pure torch.

All take S [B, B], the cosine of text i with image j, pair i being (text i, image i).

- ``vse`` (Eq. 1, Kiros et al.; the paper's choice for weakly labelled news): the sum of the
  hinges over every in-batch negative, both directions, averaged over the B pairs:
  ``1/B sum_i [sum_{j != i} [m - S_ii + S_ij]_+ + sum_{j != i} [m - S_ii + S_ji]_+]``.
- ``vsepp`` (Eq. 4, Faghri et al.): only the hardest negative of each direction
  (``training.retrieval.losses.hardest_triplet_loss``, the same formula).
- ``hal`` (Eq. 5, Liu et al. AAAI 2020): ``1/B sum_i [1/a log(1 + sum_{m != i} exp(a (S_mi - e)))
  + 1/a log(1 + sum_{n != i} exp(a (S_in - e))) - log(1 + b S_ii)]`` with a = 20, b = 30,
  e = 0.2. ``log(1 + b S_ii)`` is undefined for S_ii <= -1/b; S_ii is clamped to
  -1/b + 1e-4 there (an assumption of ours: the paper does not say), and the log-sum-exps are
  computed stably.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.news import LOSSES
from training.retrieval.losses import hardest_triplet_loss

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


def news_loss(name: str, sim: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    if sim.shape[0] < 2:
        raise ValueError("the in-batch losses need at least 2 pairs")
    if name == "vse":
        return vse_loss(sim, margin)
    if name == "vsepp":
        return vsepp_loss(sim, margin)
    if name == "hal":
        return hal_loss(sim)
    raise ValueError(f"unknown loss {name!r}; known: {', '.join(LOSSES)}")
