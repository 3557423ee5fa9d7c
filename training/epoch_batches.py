"""The batches of a training epoch: a worker's shuffled (or near-neighbour, ``training.batching``)
training batches from its Ray Data shard, and the fixed validation batches, cut the same way on
every run and shared out between the workers."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from training.data import TRAINING_COLUMNS, features_of, nonempty

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
    (``training.batching``), ``near_share`` of each batch after its first document.
    """
    per_chunk = 256 if sampling == "random" else 2048
    chunk = batch_docs * max(1, per_chunk // batch_docs)
    for table in shard.iter_batches(batch_size=chunk, batch_format="pyarrow", prefetch_batches=2):
        if sampling == "similar" and table.num_rows > batch_docs:
            from training.batching import document_signatures, similar_batches

            feats, _ = features_of(table)
            sigs = document_signatures(feats, table.column("sentences").to_pylist())
            for rows in similar_batches(sigs, batch_docs, near_share, rng):
                yield table.take(pa.array(rows))
            continue
        table = table.take(pa.array(rng.permutation(table.num_rows)))
        for start in range(0, table.num_rows, batch_docs):
            yield table.slice(start, batch_docs)


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
    return fixed_batches(paths, batch_docs, lambda i: i % world == rank, extra_columns)


def spare_batch(paths: list[str], batch_docs: int, extra_columns: tuple[str, ...] = ()):
    """The first fixed validation batch (every worker's, ``Worker.zero_step``), or None."""
    first = fixed_batches(paths, batch_docs, lambda i: i == 0, extra_columns)
    return first[0] if first else None


def fixed_batches(paths: list[str], batch_docs: int, chosen, extra_columns: tuple[str, ...] = ()) -> list:
    """The fixed batches ``i`` with ``chosen(i)`` (``validation_batches``' order and cuts).

    Two passes over the shards, so a worker holds only the documents of its own batches (and
    one read batch), never the whole split: a 1M-document corpus has 100K validation documents,
    and every worker read them all (twice: its share and the spare batch) before issue #47.
    The first pass reads the ids and the sentence and image counts (no feature); the order and
    the cuts come from them; the second reads the chosen rows' columns."""
    import pyarrow.compute as pc

    from schemas.shards import iter_tables

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
    picked = [(s, e) for i, (s, e) in enumerate(zip(starts, bounds, strict=True)) if chosen(i) and e - s >= 2]
    if not picked:
        return []
    shard_of = np.concatenate(shard_of)[order]
    row_of = np.concatenate(row_of)[order]
    wanted = np.concatenate([np.arange(s, e) for s, e in picked])  # sorted positions
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
    out, at = [], 0
    for s, e in picked:
        out.append(table.take(pa.array(row_at[at : at + e - s])))
        at += e - s
    return out
