"""The batches of a training epoch: a worker's shuffled or near-neighbour batches from its Ray Data
shard, made into tensors step by step, and fixed validation batches shared out between workers.

``--batch-sampling similar`` (issue #44, docs/training.md): a random batch holds mostly documents
of other topics, told apart by look and topic words alone, so each batch is a random document, its
nearest neighbours (mean standardised image feature + hashed bag of words, no model) and random
fill. Why no library: a greedy O(n^2) cut of one chunk fits in cache; FAISS or k-means would add an
index or clusters whose sizes do not match the batch size."""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.shards import iter_tables, nonempty
from training.data import TRAINING_COLUMNS, features_of

VAL_READ_ROWS = 1024  # rows decoded at a time while the fixed validation batches are gathered


def document_batches(
    shard, batch_docs: int, rng: np.random.Generator, sampling: str = "random", near_share: float = 0.5
) -> Iterator:
    """Batches of ``batch_docs`` documents from this worker's share of the training set.

    Ray Data hands over chunks of a few hundred documents (prefetched in the background) and
    the chunk is shuffled and cut here: asking Ray Data for every 11-document batch costs a
    few milliseconds each, as much as a training step on small documents. Chunks are a
    multiple of the batch size, so every batch but an epoch's last is full. Workers' shares need
    not be equal (Ray's split, empty documents): ``train_epoch`` keeps them in step.

    ``sampling="similar"`` (``--batch-sampling``, issue #44) cuts larger chunks (~2,048
    documents, so a topic has several documents in one) into batches of near neighbours
    (``similar_batches``), ``near_share`` of each batch after its first document.
    """
    per_chunk = 256 if sampling == "random" else 2048
    chunk = batch_docs * max(1, per_chunk // batch_docs)
    for table in shard.iter_batches(batch_size=chunk, batch_format="pyarrow", prefetch_batches=2):
        if sampling == "similar" and table.num_rows > batch_docs:
            feats, _ = features_of(table)
            sigs = document_signatures(feats, table.column("sentences").to_pylist())
            for rows in similar_batches(sigs, batch_docs, near_share, rng):
                yield table.take(pa.array(rows))
            continue
        table = table.take(pa.array(rng.permutation(table.num_rows)))
        for start in range(0, table.num_rows, batch_docs):
            yield table.slice(start, batch_docs)


def epoch_steps(
    shard, cfg, rng: np.random.Generator, make: Callable, ahead: bool = False
) -> Iterator[tuple[object | None, int]]:
    """Each step's (batch made by ``make(table, rng)``, or None where fewer than 2 documents are
    left, and the empty documents dropped): the epoch's batches of ``cfg.batch_docs`` documents
    (``cfg.batch_sampling``, ``cfg.near_share``) as ``training.loop.train_epoch`` trains them,
    every draw from ``rng`` in one order; ``ahead``: made in a background thread
    (``read_ahead``) while the caller trains on the one before."""
    steps = made_steps(shard, cfg, rng, make)
    if ahead:
        return read_ahead(steps)
    return steps


def made_steps(shard, cfg, rng: np.random.Generator, make: Callable) -> Iterator[tuple[object | None, int]]:
    """``epoch_steps`` in the calling thread."""
    for table in document_batches(shard, cfg.batch_docs, rng, cfg.batch_sampling, cfg.near_share):
        table, n_empty = drop_empty(table)
        yield (make(table, rng) if table.num_rows >= 2 else None), n_empty


def drop_empty(table: pa.Table) -> tuple[pa.Table, int]:
    """Documents without a sentence or an image have no similarity to learn from (and would
    make a NaN mean); they are removed here and counted by the caller."""
    kept = table.filter(nonempty(table))
    return kept, table.num_rows - kept.num_rows


_END = object()


def read_ahead(items: Iterator, depth: int = 2) -> Iterator:
    """``items`` in order, the next ``depth`` produced in a background thread while the caller
    works on the current one (issue #63: on a GPU the step waits on the host's batch making).

    One thread advances ``items``, so every draw it makes from a shared random generator comes
    in the same order as in a plain loop: the batches are the same. An exception in ``items``
    is raised here, at the item where it happened. A standard ``ThreadPoolExecutor`` of one
    worker keeps the order (no queue or thread of our own); closing the generator early
    cancels what has not started."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="read-ahead")
    try:
        pending = deque(pool.submit(next, items, _END) for _ in range(max(1, depth)))
        while (item := pending.popleft().result()) is not _END:
            pending.append(pool.submit(next, items, _END))
            yield item
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def validation_batches(
    paths: list[str], batch_docs: int, rank: int, world: int, extra_columns: tuple[str, ...] = ()
) -> list:
    """This worker's share of fixed validation batches.

    The validation loss picks the checkpoint, so it must not depend on which documents happen
    to share a batch: documents are sorted by id, cut into batches of ``batch_docs`` (a short
    tail joins the previous batch, so none has fewer than 2 documents), and batch i goes to
    worker i % world. The loss is then averaged per document, not per batch.
    """
    return list(fixed_batches(paths, batch_docs, lambda i: i % world == rank, extra_columns).values())


@dataclass
class ValidationSets:
    """A worker's fixed validation batches, read together (``validation_sets``)."""

    mine: list  # its share (``validation_batches``)
    spare: object | None  # the first batch, every worker's padding batch (``Worker.zero_step``)
    every: list  # every batch, for an objective with validation metrics of its own; else []


def validation_sets(
    paths: list[str], batch_docs: int, rank: int, world: int, extra_columns: tuple[str, ...] = (), every=False
) -> ValidationSets:
    """``validation_batches``, the first batch (every worker's padding batch) and (``every``) all
    the batches, from one read of the shards (its two passes) rather than one read each; a
    batch in several of them is one table."""
    chosen = fixed_batches(paths, batch_docs, lambda i: every or i == 0 or i % world == rank, extra_columns)
    mine = [t for i, t in chosen.items() if i % world == rank]
    return ValidationSets(mine, chosen.get(0), list(chosen.values()) if every else [])


def fixed_batches(paths: list[str], batch_docs: int, chosen, extra_columns: tuple[str, ...] = ()) -> dict:
    """The fixed batches ``i`` with ``chosen(i)`` (``validation_batches``' order and cuts), by
    ``i`` in order.

    Two passes over the shards, so a worker holds only the documents of its own batches (and
    one read batch), never the whole split: a 1M-document corpus has 100K validation documents,
    and every worker read them all (twice: its share and the spare batch) before issue #47.
    The first pass reads the ids and the sentence and image counts (no feature); the order and
    the cuts come from them; the second reads the chosen rows' columns."""
    light = ["doc_id", "sentences", "images.list.element.content_id"]
    ids, shard_of, row_of = [], [], []
    for k, p in enumerate(paths):
        offset = 0
        for t in iter_tables([p], VAL_READ_ROWS, light):
            keep = nonempty(t)
            rows = np.flatnonzero(np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool))
            ids.extend(pc.filter(t.column("doc_id"), keep).to_pylist())
            shard_of.append(np.full(len(rows), k, np.int64))
            row_of.append(rows + offset)
            offset += t.num_rows
    n = len(ids)
    order = np.argsort(np.array(ids, dtype=object), kind="stable") if n else np.zeros(0, np.int64)
    starts = list(range(0, n, batch_docs))
    if len(starts) > 1 and n - starts[-1] < 2:
        starts.pop()
    bounds = [*starts[1:], n]
    picked = [
        (i, s, e) for i, (s, e) in enumerate(zip(starts, bounds, strict=True)) if chosen(i) and e - s >= 2
    ]
    if not picked:
        return {}
    shard_of = np.concatenate(shard_of)[order]
    row_of = np.concatenate(row_of)[order]
    wanted = np.concatenate([np.arange(s, e) for _, s, e in picked])  # sorted positions
    parts, position = [], []  # the wanted rows as read, and each one's sorted position
    for k, p in enumerate(paths):
        mine = wanted[shard_of[wanted] == k]
        if not len(mine):
            continue
        rows = row_of[mine]
        by_row = np.argsort(rows)
        rows, mine = rows[by_row], mine[by_row]
        offset = 0
        for t in iter_tables([p], VAL_READ_ROWS, [*TRAINING_COLUMNS, *extra_columns]):
            inside = (rows >= offset) & (rows < offset + t.num_rows)
            if inside.any():
                parts.append(t.take(pa.array(rows[inside] - offset)))
                position.append(mine[inside])
            offset += t.num_rows
    # One chunk (a take over many chunks of nested lists would concatenate them on the side),
    # the read parts dropped, then each batch taken in sorted order: about twice the share at
    # the peak, one batch's worth of transient buffers.
    table = pa.concat_tables(parts).combine_chunks()
    del parts
    row_at = np.argsort(np.concatenate(position), kind="stable")  # k-th wanted position's row
    out, at = {}, 0
    for i, s, e in picked:
        out[i] = table.take(pa.array(row_at[at : at + e - s]))
        at += e - s
    return out


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
