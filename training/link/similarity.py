"""Document similarity sim(S, V) for every (sentence set, image set) pair of a batch.

All B x B pairs come from one batched, masked product ([B, B, n, m]). AP solves the B^2
matchings on detached matrices (the selection is a constant) and masks the chosen entries, so
only those carry gradient."""

from __future__ import annotations

import torch

from training.objectives import assignment_triton
from training.objectives.assignment import solve_matchings

NEG = -1e4  # finite "minus infinity" for masked cells (keeps gradients NaN-free)


def pair_matrices(s: torch.Tensor, s_mask: torch.Tensor, v: torch.Tensor, v_mask: torch.Tensor):
    """sims[a, b] = sentences of doc a x images of doc b, with its validity mask."""
    sims = torch.einsum("and,bmd->abnm", s, v)
    valid = s_mask[:, None, :, None] & v_mask[None, :, None, :]
    return sims, valid


def _k_per_pair(n: torch.Tensor, m: torch.Tensor, mode: str) -> torch.Tensor:
    """k[a, b] for sentences of a x images of b (``choose_k`` on tensors)."""
    small = torch.minimum(n[:, None], m[None, :])
    if mode == "full":
        return small
    if mode == "half":
        return torch.div(small + 1, 2, rounding_mode="floor")
    raise ValueError(f"k must be 'full' or 'half', not {mode!r}")


def _mean_top_k(values: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Mean of the k largest entries of the last axis (masked entries hold NEG)."""
    top = values.sort(dim=-1, descending=True).values.cumsum(dim=-1)
    return top.gather(-1, (k - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1) / k.clamp(min=1)


def dc(sims, valid, s_mask, v_mask, k_mode: str = "full") -> torch.Tensor:
    """Mean best match of every sentence plus of every image (k does not apply)."""
    masked = sims.masked_fill(~valid, NEG)
    row_max, col_max = masked.amax(dim=3), masked.amax(dim=2)  # [B, B, n], [B, B, m]
    rows = s_mask[:, None, :].to(sims.dtype)
    cols = v_mask[None, :, :].to(sims.dtype)
    return (row_max * rows).sum(-1) / rows.sum(-1) + (col_max * cols).sum(-1) / cols.sum(-1)


def tk(sims, valid, s_mask, v_mask, k_mode: str = "full") -> torch.Tensor:
    n, m = s_mask.sum(1), v_mask.sum(1)
    k = _k_per_pair(n, m, k_mode)
    masked = sims.masked_fill(~valid, NEG)
    row_max = masked.amax(dim=3).masked_fill(~s_mask[:, None, :], NEG)
    col_max = masked.amax(dim=2).masked_fill(~v_mask[None, :, :], NEG)
    return _mean_top_k(row_max, k) + _mean_top_k(col_max, k)


def ap(sims, valid, s_mask, v_mask, k_mode: str = "full", solver: str = "auto") -> torch.Tensor:
    """Mean of the k entries of the best k-edge matching, for all B x B pairs in one solve.

    The solver sees the detached matrices, in float64 (its choice is a constant); the selection masks
    ``sims``, so only the matched cells carry gradient. Masks are prefixes (``pad_documents``).
    ``solver``: ``auto`` solves on the GPU (``assignment_triton``) where ``sims`` is a CUDA tensor
    and Triton is there, else on the host; ``host`` always copies to the host (numpy solvers).
    """
    B, _, N, M = sims.shape
    n, m = s_mask.sum(1), v_mask.sum(1)
    k = _k_per_pair(n, m, k_mode)  # [B, B]
    if solver not in ("auto", "host"):
        raise ValueError(f"AP solver must be 'auto' or 'host', not {solver!r}")
    if solver == "auto" and assignment_triton.available(sims.device):
        # on the device, from sims as it is (no copies: a GPU step is launch-bound)
        chosen = assignment_triton.ap_matchings(sims.detach(), n, m, k)
    else:
        # A diverged model's NaN/inf must not reach the solver (a solver on NaN is undefined: it
        # crashed a training worker): solve on zeros there (the kernel does the same); the matched
        # cells of ``sims`` keep the NaN, so the loss is non-finite and the loop stops with its
        # "loss diverged" error.
        weights = torch.nan_to_num(sims.detach().to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
        chosen = torch.from_numpy(
            solve_matchings(
                weights.cpu().numpy().reshape(B * B, N, M),
                n[:, None].expand(B, B).reshape(-1).cpu().numpy(),
                m[None, :].expand(B, B).reshape(-1).cpu().numpy(),
                k.reshape(-1).cpu().numpy(),
                sims.device.type,
            )
        ).to(sims.device)
    chosen = chosen.view(B, B, N, M)
    total = torch.where(chosen, sims, torch.zeros((), dtype=sims.dtype, device=sims.device)).sum((2, 3))
    return total / k.clamp(min=1).to(sims.dtype)


def document_similarity(
    kind: str,
    s: torch.Tensor,
    s_mask: torch.Tensor,
    v: torch.Tensor,
    v_mask: torch.Tensor,
    k_mode: str = "full",
) -> torch.Tensor:
    """[B, B] matrix: entry (a, b) = sim(sentences of a, images of b)."""
    if kind not in SIMILARITIES:
        raise ValueError(f"unknown similarity {kind!r}; known: {tuple(SIMILARITIES)}")
    sims, valid = pair_matrices(s, s_mask, v, v_mask)
    return SIMILARITIES[kind](sims, valid, s_mask, v_mask, k_mode)


# The document similarities an objective can train (ObjectiveSpec.similarity names one).
SIMILARITIES = {"dc": dc, "tk": tk, "ap": ap}
