"""AP's k-edge matchings solved on the GPU: one Triton program per problem, no host round trip.

Why a kernel: the numpy solvers need the matrices copied to the host every step, and at B = 64
the 4,096 tiny problems cost more than the rest of the step. Hungarian with shortest augmenting
paths (Jonker-Volgenant), the smaller side as rows and ``assignment.py``'s dummy reduction for
k < min(n, m); row potentials are kept per column (``uc[j]``; slot 0 the row being added) so the
scatter becomes a vector op. float64 throughout; on CPU it runs in Triton's interpreter (tests)."""

from __future__ import annotations

import functools
import os

import torch

try:  # Triton ships with Linux PyTorch wheels; without it AP solves on the host (assignment.py)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the platform's wheels
    triton = None


# Warps per problem's program: its vectors hold 2S + 1 <= 64 columns, so one warp of 32 lanes
# keeps every reduction inside the warp (no shared-memory round trip).
NUM_WARPS = 1


def available(device: torch.device | str) -> bool:
    """True where this solver can run: a CUDA device and an importable Triton."""
    return triton is not None and torch.device(device).type == "cuda"


def _hungarian(
    w_ptr, s_a, s_b, s_n, s_m, B2, n_ptr, n_div, m_ptr, m_mod, k_ptr, out_ptr, N, M, BLOCK: tl.constexpr
):
    """One problem per program. Problem ``pid`` reads w[pid // B2, pid % B2] (strides s_a, s_b, then
    s_n, s_m over its N x M block), n[pid // n_div] rows, m[pid % m_mod] columns and k[pid] edges,
    and writes its chosen cells as 0/1 bytes to out[pid] (N x M, contiguous). Non-finite weights
    count as 0 (a diverged model's matrix must not derail the search; its loss reports it).
    """
    pid = tl.program_id(0)
    n = tl.load(n_ptr + pid // n_div).to(tl.int32)
    m = tl.load(m_ptr + pid % m_mod).to(tl.int32)
    kk = tl.load(k_ptr + pid).to(tl.int32)
    trans = n > m  # rows must be the smaller side: read the block transposed
    r = tl.minimum(n, m)
    c = tl.maximum(n, m)
    row_step = tl.where(trans, s_m, s_n)
    col_step = tl.where(trans, s_n, s_m)
    base = w_ptr + (pid // B2).to(tl.int64) * s_a + (pid % B2).to(tl.int64) * s_b
    offs = tl.arange(0, BLOCK)  # column 0 is the method's virtual column
    real = (offs >= 1) & (offs <= c)
    ncol = c + r - kk  # real columns, then r - k dummies
    col_ok = (offs >= 1) & (offs <= ncol)
    col_off = (offs - 1) * col_step
    high = tl.zeros([BLOCK], dtype=tl.float64)  # max |w|, then a dummy's value: beats any real edge
    for i in range(0, r):
        w = tl.load(base + i * row_step + col_off, mask=real, other=0.0).to(tl.float64)
        high = tl.maximum(high, tl.where(tl.abs(w) < float("inf"), tl.abs(w), 0.0))
    high = 2.0 * tl.max(high, axis=0) + 1.0
    v = tl.zeros([BLOCK], dtype=tl.float64)  # column potentials
    uc = tl.zeros([BLOCK], dtype=tl.float64)  # potential of the row matched to each column
    p = tl.zeros([BLOCK], dtype=tl.int32)  # row matched to each column (1-based; 0 = free)
    way = tl.zeros([BLOCK], dtype=tl.int32)  # previous column on the shortest path
    for i in range(1, r + 1):
        p = tl.where(offs == 0, i, p)
        uc = tl.where(offs == 0, 0.0, uc)  # a row not yet added has potential 0
        minv = tl.full([BLOCK], float("inf"), dtype=tl.float64)
        used = offs < 0  # all False
        j0 = tl.sum(tl.where(offs == 0, offs, 0), axis=0)  # 0, as an int32 scalar
        searching = j0 == 0
        while searching:
            at_j0 = offs == j0
            used = used | at_j0
            i0 = tl.sum(tl.where(at_j0, p, 0), axis=0)
            u_i0 = tl.sum(tl.where(at_j0, uc, 0.0), axis=0)
            w = tl.load(base + (i0 - 1) * row_step + col_off, mask=real, other=0.0).to(tl.float64)
            w = tl.where(tl.abs(w) < float("inf"), w, 0.0)  # NaN and +-inf -> 0
            cur = tl.where(real, -w, -high) - u_i0 - v
            free = col_ok & (~used)
            better = free & (cur < minv)
            minv = tl.where(better, cur, minv)
            way = tl.where(better, j0, way)
            cand = tl.where(free, minv, float("inf"))
            delta = tl.min(cand, axis=0)
            j1 = tl.argmin(cand, axis=0).to(tl.int32)
            uc = tl.where(used, uc + delta, uc)
            v = tl.where(used, v - delta, v)
            minv = tl.where(used, minv, minv - delta)
            j0 = j1
            searching = tl.sum(tl.where(offs == j0, p, 0), axis=0) != 0
        while j0 != 0:  # flip the path back to column 0; each row moves with its potential
            j1 = tl.sum(tl.where(offs == j0, way, 0), axis=0)
            p_j1 = tl.sum(tl.where(offs == j1, p, 0), axis=0)
            u_j1 = tl.sum(tl.where(offs == j1, uc, 0.0), axis=0)
            p = tl.where(offs == j0, p_j1, p)
            uc = tl.where(offs == j0, u_j1, uc)
            j0 = j1
    # out[a, b] = 1 where the matching holds sentence a and image b, a row a at a time; b = column
    # offs - 1. Unflipped, kernel column b + 1 holds row p[b + 1] = a + 1; flipped, kernel column
    # a + 1 holds row p[a + 1] = b + 1.
    out = out_ptr + pid.to(tl.int64) * N * M
    for a in range(0, N):
        p_a = tl.sum(tl.where((offs == a + 1) & real, p, 0), axis=0)
        chosen = tl.where(trans, offs == p_a, (p == a + 1) & real)
        tl.store(out + a * M + offs - 1, chosen.to(tl.uint8), mask=(offs >= 1) & (offs <= M))


@functools.cache
def _kernel():
    """The kernel, compiled on first use (or interpreted where TRITON_INTERPRET=1 was set before
    Triton was imported: then it runs on CPU tensors, which is how the tests check it)."""
    return triton.jit(_hungarian)


def _launch(w4: torch.Tensor, n: torch.Tensor, n_div: int, m: torch.Tensor, m_mod: int, k: torch.Tensor):
    """w4 [A, B2, N, M] (any float dtype and strides) -> bool [A * B2, N, M] chosen cells."""
    if triton is None:
        raise RuntimeError("the GPU assignment solver needs Triton (it ships with Linux PyTorch wheels)")
    A, B2, N, M = w4.shape
    dev = w4.device
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the GPU assignment solver needs CUDA tensors (or TRITON_INTERPRET=1 for tests)")
    out = torch.empty((A * B2, N, M), dtype=torch.uint8, device=dev)
    if out.numel() == 0:
        return out.view(torch.bool)
    block = triton.next_power_of_2(2 * max(N, M) + 1)  # column 0, real columns, dummies
    n, m, k = (x.to(dev).reshape(-1) for x in (n, m, k))
    _kernel()[(A * B2,)](
        w4, *w4.stride(), B2, n, n_div, m, m_mod, k, out, N, M, BLOCK=block, num_warps=NUM_WARPS
    )
    return out.view(torch.bool)


def triton_max_weight_matching(
    weights: torch.Tensor, n: torch.Tensor, m: torch.Tensor, k: torch.Tensor
) -> torch.Tensor:
    """``batched_max_weight_matching``'s contract on tensors, on their device, without a sync.

    weights [P, N, M] (finite inside each n[p] x m[p] block), n, m, k [P] -> bool [P, N, M] with
    exactly k[p] cells chosen in problem p, at most one per row and column, of maximum total weight.
    """
    P = weights.shape[0]
    return _launch(weights[:, None], n, 1, m, max(P, 1), k)


def ap_matchings(sims: torch.Tensor, n: torch.Tensor, m: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """AP's B x B problems straight from the similarity tensor: sims [B, B, N, M] (sentences of
    document a x images of document b, any strides, read as they are), n [B], m [B], k [B, B] ->
    bool [B, B, N, M]. No copies before the kernel: on a GPU each launch counts (the step is
    launch-bound there)."""
    B, _, N, M = sims.shape
    return _launch(sims, n, B, m, B, k).view(B, B, N, M)
