"""Batches of similar documents (issue #44; Li et al. 2021's sampling bias of cross-document training).

When a look and a vocabulary are shared by every document of a topic, a random batch holds
mostly documents of other topics, which the model tells apart by the look and the topic words
alone; the negatives that force the content (documents of the same topic) are rare. Here a chunk
of documents is cut into batches of near neighbours: each batch starts at a random document and
takes the documents most like it (cosine of a signature made of the document's mean standardised
image feature and a hashed bag of its words, both read from the rows, no model), then fills the
rest with random documents, so hard negatives come from the same topic and some easy ones stay.

Why not a library: the grouping is a greedy nearest-neighbour cut of a few hundred to a few
thousand rows per chunk (O(n^2) on a matrix that fits in cache); FAISS or scikit-learn's k-means
would add an index or a clustering whose cluster sizes do not match the batch size.
"""

from __future__ import annotations

import zlib

import numpy as np

HASH_DIM = 512  # buckets of the hashed bag of words


def _bag_of_words(sentences: list[list[str]]) -> np.ndarray:
    """Each document's sentences -> an L2-normalised hashed word-count vector [n_docs, HASH_DIM]."""
    out = np.zeros((len(sentences), HASH_DIM), np.float32)
    for i, doc in enumerate(sentences):
        for s in doc:
            for w in s.lower().split():
                out[i, zlib.crc32(w.encode()) % HASH_DIM] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def document_signatures(features: list[np.ndarray], sentences: list[list[str]]) -> np.ndarray:
    """Per-document signature [n_docs, D + HASH_DIM]: the mean image feature standardised over
    these documents and L2-normalised, beside the hashed bag of words; equal weight to each."""
    dim = max((f.shape[1] for f in features if f.ndim == 2), default=0)
    means = np.stack([f.mean(0) if len(f) else np.zeros(dim, np.float32) for f in features])
    means = (means - means.mean(0)) / (means.std(0) + 1e-6)
    means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-9)
    return np.concatenate([means, _bag_of_words(sentences)], axis=1)


def similar_batches(
    signatures: np.ndarray, batch_docs: int, near_share: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Row indices of batches covering every row once: each batch is a random row, its
    ``round(near_share * (batch_docs - 1))`` nearest unused rows, then random unused rows."""
    n = len(signatures)
    sims = signatures @ signatures.T
    unused = np.ones(n, bool)
    n_near = round(near_share * (batch_docs - 1))
    batches = []
    for start in rng.permutation(n):
        if not unused[start]:
            continue
        unused[start] = False
        free = np.flatnonzero(unused)
        near = free[np.argsort(-sims[start, free], kind="stable")[:n_near]]
        unused[near] = False
        free = np.flatnonzero(unused)
        rest = rng.choice(free, size=min(len(free), batch_docs - 1 - len(near)), replace=False)
        unused[rest] = False
        batches.append(np.concatenate([[start], near, rest]).astype(np.int64))
    return batches
