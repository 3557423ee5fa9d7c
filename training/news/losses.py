"""The bidirectional in-batch losses of Liu et al.'s Table 1 (Sect. 4.1 and 6.1.1). Pure torch.

All take S [B, B], the score of text i with image j, pair i being (text i, image i): the cosine,
except for ``order`` (the negative order violation, ``order_scores``).

- ``vse`` (Eq. 1, Kiros et al.; the paper's choice for weakly labelled news): the sum of the
  hinges over every in-batch negative, both directions, averaged over the B pairs:
  ``1/B sum_i [sum_{j != i} [m - S_ii + S_ij]_+ + sum_{j != i} [m - S_ii + S_ji]_+]``.
- ``vsepp`` (Eq. 4, Faghri et al.): only the hardest negative of each direction
  (``training.joint_space.hardest_triplet_loss``, the same formula).
- ``hal`` (Eq. 5, Liu et al. AAAI 2020): ``1/B sum_i [1/a log(1 + sum_{m != i} exp(a (S_mi - e)))
  + 1/a log(1 + sum_{n != i} exp(a (S_in - e))) - log(1 + b S_ii)]`` with a = 20, b = 30,
  e = 0.2. ``log(1 + b S_ii)`` is undefined for S_ii <= -1/b; S_ii is clamped to
  -1/b + 1e-4 there (an assumption of ours: the paper does not say), and the log-sum-exps are
  computed stably.
- ``order`` (ORDER, Vendrov et al. 2016, the paper's line 1.3): the embeddings are non-negative
  (absolute values, ``NewsConfig.score = "order"``) and an image is a *specialisation* of its
  text (text is the more abstract partial-order element, as Vendrov's captions of images):
  the order-violation penalty ``E(image, text) = ||max(0, text - image)||^2`` is 0 when every
  coordinate of the image is at least the text's. The score is ``S = -E`` (``order_scores``)
  and the loss is Vendrov's contrastive hinge over every in-batch negative, both directions:
  the ``vse`` formula on that S (Vendrov's margin is 0.05, Table 1's ORDER row sets it).
"""

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
