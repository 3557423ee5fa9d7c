"""Li et al. (2021) objectives: cross-document (C), intra-document (I), dropout sub-document (D).

All three read ONE batched [B, B, n, m] pair tensor with TK at k = min(n, m): C is Hessel 2019's
in-batch hinge; I compares each document's TK with NegTK(M) = -TK(-M); D makes a random
sub-document beat C's in-batch negatives with margin alpha/2 (Eq. 4). The total sums the chosen
parts. Why all B x B pairs: the wasted arithmetic reuses the tested ``tk`` and needs no loop."""

from __future__ import annotations

import torch

from training.link.li2021_parts import LI2021_PARTS
from training.link.loss import hinge, in_batch_loss
from training.link.similarity import pair_matrices, tk

PARTS = LI2021_PARTS
# floor(p * n) in floating point: 0.29 * 100 = 28.999999999999996; the epsilon makes the count
# the decimal one the user meant, far below any real fraction's resolution.
_FLOOR_EPS = 1e-6


def neg_tk(
    sims: torch.Tensor, valid: torch.Tensor, s_mask: torch.Tensor, v_mask: torch.Tensor
) -> torch.Tensor:
    """NegTK(M) = -TK(-M): mean of the k smallest row minima plus the k smallest column minima."""
    return -tk(-sims, valid, s_mask, v_mask, "full")


def sub_document_masks(
    s_mask: torch.Tensor,
    v_mask: torch.Tensor,
    fraction: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform draws without replacement of floor(fraction * count) (>= 1) valid slots per row.

    Random keys are drawn on the generator's device (a CPU generator works for CUDA tensors);
    padded slots get a key above every real one, so they are never kept.
    """

    def keep(mask: torch.Tensor) -> torch.Tensor:
        count = mask.sum(1)
        n_keep = torch.floor(count.double() * fraction + _FLOOR_EPS).long().clamp(min=1)
        n_keep = torch.minimum(n_keep, count)
        device = generator.device if generator is not None else mask.device
        keys = torch.rand(mask.shape, generator=generator, device=device).to(mask.device)
        keys = keys.masked_fill(~mask, 2.0)
        rank = keys.argsort(dim=1).argsort(dim=1)
        return rank < n_keep[:, None]

    return keep(s_mask), keep(v_mask)


def _with_diagonal(doc_sims: torch.Tensor, diag: torch.Tensor) -> torch.Tensor:
    """``doc_sims`` with its diagonal (the positives) replaced; the off-diagonal negatives stay."""
    eye = torch.eye(doc_sims.shape[0], dtype=torch.bool, device=doc_sims.device)
    return torch.where(eye, diag[:, None].expand_as(doc_sims), doc_sims)


def li2021_loss(
    s_pad: torch.Tensor,
    s_mask: torch.Tensor,
    v_pad: torch.Tensor,
    v_mask: torch.Tensor,
    parts: tuple[str, ...] = PARTS,
    margin: float = 0.2,
    negatives: str = "hard",
    sub_fraction: float = 0.8,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(total loss, each selected part's value) for padded [B, n, d] / [B, m, d] unit vectors.

    ``generator`` drives the sub-document draws only (D); pass a fixed one on validation
    batches so that the validation loss is comparable between epochs.
    """
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ValueError(f"li2021 parts must be a non-empty subset of {PARTS}, not {parts!r}")
    sims, valid = pair_matrices(s_pad, s_mask, v_pad, v_mask)
    doc_sims = tk(sims, valid, s_mask, v_mask, "full")  # [B, B]; diagonal = TK(M_i)
    terms: dict[str, torch.Tensor] = {}
    if "C" in parts:
        terms["C"] = in_batch_loss(doc_sims, margin, negatives)
    if "I" in parts:
        neg = neg_tk(sims, valid, s_mask, v_mask).diagonal()
        terms["I"] = hinge(doc_sims.diagonal(), neg, margin / 2).mean()
    if "D" in parts:
        s_sub, v_sub = sub_document_masks(s_mask, v_mask, sub_fraction, generator)
        valid_sub = s_sub[:, None, :, None] & v_sub[None, :, None, :]
        sub = tk(sims, valid_sub, s_sub, v_sub, "full").diagonal()  # sim(S_i^sub, V_i^sub)
        terms["D"] = in_batch_loss(_with_diagonal(doc_sims, sub), margin / 2, negatives)
    total = torch.stack([terms[p] for p in PARTS if p in terms]).sum()
    return total, {p: float(t.detach()) for p, t in terms.items()}
