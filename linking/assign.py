"""Predicted links from padded score matrices, a whole batch of documents at a time.

``matching`` is the one-to-one maximum-weight matching (what the model was trained to find);
``argmax`` gives each image its best sentence (mmc4's way). Either way an image scoring below
``min_score`` stays unlinked (-1, NaN). Document b is the top-left ``n[b] x m[b]`` block of
``scores [B, N, M]``."""

from __future__ import annotations

import numpy as np

from training.objectives.assignment import solve_matchings

UNLINKED = -1


def _valid(n: np.ndarray, m: np.ndarray, N: int, M: int) -> np.ndarray:
    return (np.arange(N)[None, :] < n[:, None])[:, :, None] & (np.arange(M)[None, None, :] < m[:, None, None])


def argmax_links(scores: np.ndarray, n: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[B, M] sentence index per image: the highest-scoring sentence (first on ties)."""
    B, N, M = scores.shape
    masked = np.where(_valid(np.asarray(n), np.asarray(m), N, M), scores, -np.inf)
    best = masked.argmax(axis=1) if N else np.zeros((B, M), dtype=np.int64)
    return np.where(np.arange(M)[None, :] < np.asarray(m)[:, None], best, UNLINKED)


def matching_links(scores: np.ndarray, n: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[B, M] sentence index per image from the maximum-weight min(n, m)-edge matching
    (-1 for images the matching leaves out: more images than sentences)."""
    n, m = np.asarray(n, dtype=np.int64), np.asarray(m, dtype=np.int64)
    w = np.where(_valid(n, m, *scores.shape[1:]), scores, 0.0)  # padding is ignored but must be finite
    chosen = solve_matchings(w, n, m, np.minimum(n, m))  # [B, N, M]
    return np.where(chosen.any(axis=1), chosen.argmax(axis=1), UNLINKED)


ASSIGNERS = {"matching": matching_links, "argmax": argmax_links}


def assign_links(
    scores: np.ndarray, n: np.ndarray, m: np.ndarray, mode: str, min_score: float
) -> tuple[np.ndarray, np.ndarray]:
    """([B, M] linked sentence or -1, [B, M] link score or NaN) under ``mode``, with links
    scoring below ``min_score`` dropped."""
    if mode not in ASSIGNERS:
        raise ValueError(f"assign must be one of {', '.join(ASSIGNERS)}, not {mode!r}")
    scores = np.asarray(scores, dtype=np.float64)
    sentence = ASSIGNERS[mode](scores, n, m)
    linked = sentence >= 0
    B, _, M = scores.shape
    got = scores[np.arange(B)[:, None], np.maximum(sentence, 0), np.arange(M)[None, :]]
    linked &= got >= min_score
    return np.where(linked, sentence, UNLINKED), np.where(linked, got, np.nan)


def pad_scores(matrices: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-document [n, m] matrices -> (padded [B, N, M], n, m)."""
    n = np.array([s.shape[0] for s in matrices], dtype=np.int64)
    m = np.array([s.shape[1] for s in matrices], dtype=np.int64)
    out = np.zeros((len(matrices), int(n.max(initial=0)), int(m.max(initial=0))))
    for b, s in enumerate(matrices):
        out[b, : s.shape[0], : s.shape[1]] = s
    return out, n, m
