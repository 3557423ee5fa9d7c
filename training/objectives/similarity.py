"""Document similarity sim(S, V) for every (sentence set, image set) pair of a batch.

All B x B pairs come from one batched product of padded sentence and image embeddings
([B, n, d] x [B, m, d] -> [B, B, n, m]); padding is masked. DC and TK are pure tensor ops; AP
solves one small assignment per pair on the detached matrix (the solver's choice is a constant)
and gathers the selected entries, so only those carry gradient.
"""

from __future__ import annotations

import numpy as np
import torch

from training.objectives.assignment import choose_k, max_weight_matching

NEG = -1e4  # finite "minus infinity" for masked cells (keeps gradients NaN-free)
SIMILARITIES = ("dc", "tk", "ap")


def pair_matrices(s: torch.Tensor, s_mask: torch.Tensor, v: torch.Tensor, v_mask: torch.Tensor):
    """sims[a, b] = sentences of doc a x images of doc b, with its validity mask."""
    sims = torch.einsum("and,bmd->abnm", s, v)
    valid = s_mask[:, None, :, None] & v_mask[None, :, None, :]
    return sims, valid


def _k_per_pair(n: torch.Tensor, m: torch.Tensor, mode: str) -> torch.Tensor:
    small = torch.minimum(n[:, None], m[None, :])
    return small if mode == "full" else torch.div(small + 1, 2, rounding_mode="floor")


def _mean_top_k(values: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Mean of the k largest entries of the last axis (masked entries hold NEG)."""
    top = values.sort(dim=-1, descending=True).values.cumsum(dim=-1)
    return top.gather(-1, (k - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1) / k.clamp(min=1)


def dc(sims, valid, s_mask, v_mask) -> torch.Tensor:
    row_max = sims.masked_fill(~valid, NEG).amax(dim=3)  # [B, B, n]
    col_max = sims.masked_fill(~valid, NEG).amax(dim=2)  # [B, B, m]
    rows = s_mask[:, None, :].to(sims.dtype)
    cols = v_mask[None, :, :].to(sims.dtype)
    return (row_max * rows).sum(-1) / rows.sum(-1) + (col_max * cols).sum(-1) / cols.sum(-1)


def tk(sims, valid, s_mask, v_mask, k_mode: str = "full") -> torch.Tensor:
    n, m = s_mask.sum(1), v_mask.sum(1)
    k = _k_per_pair(n, m, k_mode)
    row_max = sims.masked_fill(~valid, NEG).amax(dim=3).masked_fill(~s_mask[:, None, :], NEG)
    col_max = sims.masked_fill(~valid, NEG).amax(dim=2).masked_fill(~v_mask[None, :, :], NEG)
    return _mean_top_k(row_max, k) + _mean_top_k(col_max, k)


def ap(sims, valid, s_mask, v_mask, k_mode: str = "full") -> torch.Tensor:
    n = s_mask.sum(1).tolist()
    m = v_mask.sum(1).tolist()
    detached = sims.detach().float().cpu().numpy()
    B = sims.shape[0]
    idx_a, idx_b, idx_r, idx_c, pair = [], [], [], [], []
    ks = np.zeros((B, B), dtype=np.float32)
    for a in range(B):
        for b in range(B):
            k = choose_k(n[a], m[b], k_mode)
            r, c = max_weight_matching(detached[a, b, : n[a], : m[b]], k)
            idx_a.append(np.full(k, a))
            idx_b.append(np.full(k, b))
            idx_r.append(r)
            idx_c.append(c)
            pair.append(np.full(k, a * B + b))
            ks[a, b] = k
    to_t = lambda x: torch.from_numpy(np.concatenate(x)).to(sims.device)
    picked = sims[to_t(idx_a), to_t(idx_b), to_t(idx_r), to_t(idx_c)]
    total = torch.zeros(B * B, dtype=sims.dtype, device=sims.device).index_add(0, to_t(pair), picked)
    return total.view(B, B) / torch.from_numpy(ks).to(sims.device)


def document_similarity(
    kind: str,
    s: torch.Tensor,
    s_mask: torch.Tensor,
    v: torch.Tensor,
    v_mask: torch.Tensor,
    k_mode: str = "full",
) -> torch.Tensor:
    """[B, B] matrix: entry (a, b) = sim(sentences of a, images of b)."""
    sims, valid = pair_matrices(s, s_mask, v, v_mask)
    if kind == "dc":
        return dc(sims, valid, s_mask, v_mask)
    if kind == "tk":
        return tk(sims, valid, s_mask, v_mask, k_mode)
    if kind == "ap":
        return ap(sims, valid, s_mask, v_mask, k_mode)
    raise ValueError(f"unknown similarity {kind!r}; known: {SIMILARITIES}")
