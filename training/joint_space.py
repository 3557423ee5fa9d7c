"""The shared text-image space of the retrieval and news families: the image bottleneck and the
in-batch triplet losses over matched (text, image) pairs.

Both families embed a text and an image as unit vectors of one d_shared space and train on
B matched pairs; what they share lives here, in the core, so neither family imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from training.model import ImageEncoder, ModelConfig

MARGIN = 0.3  # Alikhani et al.'s triplet margin


@dataclass(frozen=True)
class BottleneckConfig:
    """The sizes of a ``BottleneckImageEncoder``: CNN feature width, dropout, shared width."""

    image_dim: int
    d_shared: int
    image_dropout: float = 0.0


class BottleneckImageEncoder(ImageEncoder):
    """[N, image_dim] CNN features -> standardise -> dropout -> linear -> L2 -> [N, d_shared].

    The linking model's image encoder (same parameters and feature statistics), sized by ``cfg``
    (a ``BottleneckConfig``, or any config with its fields: the retrieval family passes its
    ``RetrievalConfig``): Alikhani et al.'s bottleneck is that projection into the shared space,
    and the news model's image tower is the same."""

    def __init__(self, cfg: BottleneckConfig):
        super().__init__(
            ModelConfig(
                vocab_size=0, image_dim=cfg.image_dim, image_dropout=cfg.image_dropout, d_multi=cfg.d_shared
            )
        )


def hardest_triplet_loss(s: torch.Tensor, v: torch.Tensor, margin: float = MARGIN) -> torch.Tensor:
    """s, v [B, d] unit vectors of B matched pairs -> the mean two-direction hardest-negative hinge."""
    B = s.shape[0]
    if B < 2:
        raise ValueError("the in-batch triplet loss needs at least 2 pairs")
    scores = s @ v.T  # [B, B], text x image
    pos = scores.diagonal()
    off = scores.masked_fill(torch.eye(B, dtype=torch.bool, device=s.device), float("-inf"))
    hardest_image = off.amax(1)  # per text
    hardest_text = off.amax(0)  # per image
    return (F.relu(margin - pos + hardest_image) + F.relu(margin - pos + hardest_text)).mean()


def mean_triplet_loss(s: torch.Tensor, v: torch.Tensor, margin: float = MARGIN) -> torch.Tensor:
    """The same hinge averaged over every in-batch negative instead of the hardest one (VSE0):
    the warm-up of ``hardest_triplet_loss``, which from random weights collapses every embedding
    to one point (loss 2 x margin; docs/benchmarks.md, "Coherence retrieval")."""
    B = s.shape[0]
    if B < 2:
        raise ValueError("the in-batch triplet loss needs at least 2 pairs")
    scores = s @ v.T
    pos = scores.diagonal()
    eye = torch.eye(B, dtype=torch.bool, device=s.device)
    per_image = F.relu(margin - pos[:, None] + scores).masked_fill(eye, 0.0).sum(1)  # text i vs images j
    per_text = F.relu(margin - pos[None, :] + scores).masked_fill(eye, 0.0).sum(0)  # image i vs texts j
    return (per_image + per_text).mean() / (B - 1)
