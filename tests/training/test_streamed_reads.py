"""The readers of a whole split stream it (issue #47): the workers' fixed validation batches,
the driver's test evaluation, its label check and its report cards.

Each is checked twice: its output equals what the whole-split read gave (that read is the oracle
here), and the peak of Arrow's memory while it runs stays well under the split's decoded
features, which the whole-split read had to hold at once (a fresh proxy pool measures it).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.document import SCHEMA_VERSION, Document, ImageRecord
from schemas.manifest import FeatureExtractorInfo, Manifest, ShardInfo
from schemas.shards import iter_tables, read_table, write_shard
from training.data import TRAINING_COLUMNS
from training.epoch_batches import drop_empty

DIM = 1024
WORDS = "red blue green small big round square star circle moon kite shelf".split()


def documents(split: str, n: int, seed: int, empty_every: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n):
        k, m = int(rng.integers(2, 5)), int(rng.integers(2, 5))
        if empty_every and d % empty_every == 0:
            m = 0  # a document without an image: dropped by every reader
        images = [
            ImageRecord(f"{split}{d}-{i}", "", 8, 8, 0, rng.random(DIM).astype(np.float32).tolist())
            for i in range(m)
        ]
        sentences = [" ".join(rng.choice(WORDS, 4)) for _ in range(k)]
        links = [(i, i) for i in range(min(k, m))] or None
        # ids in random order across shards, as the build's hashing spreads them
        docs.append(
            Document(
                f"{split}-{rng.integers(1 << 40):012x}-{d}", "synthetic", split, sentences, images, links
            )
        )
    return docs


def write_dataset(root: Path, splits: dict[str, list[Document]], per_shard: int) -> Path:
    shards = []
    for split, docs in splits.items():
        for k in range(0, len(docs), per_shard):
            part = sorted(docs[k : k + per_shard], key=lambda d: d.doc_id)
            rel = f"shards/{split}-{k // per_shard:05d}-000.parquet"
            rows, size, sha = write_shard(root / rel, part)
            shards.append(ShardInfo(rel, split, rows, size, sha))
    counts = {"splits": {s: len(d) for s, d in splits.items()}, "dropped": {}}
    info = FeatureExtractorInfo("efficientnet-lite0", "test", DIM)
    Manifest(SCHEMA_VERSION, "v-stream", "synthetic", counts, info, shards).write(root)
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    splits = {
        "train": documents("train", 40, 1),
        "val": documents("val", 600, 2, empty_every=7),
        "test": documents("test", 600, 3, empty_every=11),
    }
    return write_dataset(tmp_path_factory.mktemp("stream"), splits, per_shard=50)


def paths_of(root: Path, split: str) -> list[str]:
    return [str(p) for p in Manifest.read(root).shard_paths(root, split)]


def feature_bytes(paths: list[str]) -> int:
    """The split's features as decoded float32 values (what a whole-split read holds)."""
    return sum(
        t.column("images").combine_chunks().flatten().field("features").flatten().nbytes
        for t in [read_table(paths, ["images"])]
    )


POOLS: list = []


@contextlib.contextmanager
def arrow_peak():
    """A fresh Arrow memory pool for the block; yields a list that gets its peak bytes."""
    previous = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(pa.system_memory_pool())
    POOLS.append(pool)  # buffers allocated in it may outlive the block: the pool must too
    pa.set_memory_pool(pool)
    out: list[int] = []
    try:
        yield out
    finally:
        pa.set_memory_pool(previous)
        out.append(pool.max_memory())


def whole_split_batches(paths, batch_docs, rank, world, extra=()):
    """The pre-#47 reading of ``validation_batches``: the whole split, sorted, then cut."""
    table, _ = drop_empty(read_table(paths, columns=[*TRAINING_COLUMNS, *extra]).sort_by("doc_id"))
    starts = list(range(0, table.num_rows, batch_docs))
    if len(starts) > 1 and table.num_rows - starts[-1] < 2:
        starts.pop()
    bounds = [*starts[1:], table.num_rows]
    batches = [table.slice(s, e - s) for s, e in zip(starts, bounds, strict=True)]
    return [b for i, b in enumerate(batches) if i % world == rank and b.num_rows >= 2]


@settings(max_examples=12, deadline=None)
@given(st.integers(2, 40), st.integers(1, 3), st.data())
def test_validation_batches_equal_the_whole_split_reading(dataset, batch_docs, world, data):
    from training.epoch_batches import validation_batches, validation_sets

    paths = paths_of(dataset, "val")
    rank = data.draw(st.integers(0, world - 1))
    got = validation_batches(paths, batch_docs, rank, world)
    want = whole_split_batches(paths, batch_docs, rank, world)
    assert [b.column("doc_id").to_pylist() for b in got] == [b.column("doc_id").to_pylist() for b in want]
    assert all(g.equals(w) for g, w in zip(got, want, strict=True))
    # what a worker's loop reads: its share, the padding batch and every batch, from one read
    sets = validation_sets(paths, batch_docs, rank, world, every=True)
    every = whole_split_batches(paths, batch_docs, 0, 1)
    assert all(g.equals(w) for g, w in zip(sets.mine, want, strict=True))
    assert all(g.equals(w) for g, w in zip(sets.every, every, strict=True))
    assert sets.spare.equals(every[0])
    assert validation_sets(paths, batch_docs, rank, world).every == []


def test_validation_batches_hold_only_the_workers_share(dataset):
    from training.epoch_batches import validation_batches

    paths = paths_of(dataset, "val")
    split = feature_bytes(paths)
    with arrow_peak() as peak:
        mine = validation_batches(paths, 8, 0, 4)
        del mine
    # a quarter of the batches (twice while they are put in order) and one shard; the whole-split
    # read held all of them, several times over (stored bytes, decoded, sorted copy)
    assert peak[0] < 0.75 * split, (peak[0], split)


def test_evaluation_streams_the_test_split(dataset):
    from training.backbone import build_model, get_backbone
    from training.config import TrainConfig
    from training.evaluate import evaluate
    from training.text import Vocabulary

    vocab = Vocabulary.build(WORDS, min_count=1)
    torch.manual_seed(0)
    train = TrainConfig(data=str(dataset), d_multi=32)
    manifest = Manifest.read(dataset)
    cfg = get_backbone(train.model_backbone).model_config(train, manifest, len(vocab), 50, [])
    model = build_model(cfg).eval()
    paths = paths_of(dataset, "test")
    split = feature_bytes(paths)
    with arrow_peak() as peak:
        got = evaluate(model, vocab, dataset, "test", batch_docs=16, seed=3)
    assert peak[0] < 0.25 * split, (peak[0], split)
    # the oracle: the pre-#47 evaluation (the whole split read, sorted, cut into batches)
    from training.data import link_scores, make_batch
    from training.metrics import document_metrics, random_baseline, summarize

    table = read_table(paths, TRAINING_COLUMNS).sort_by("doc_id")
    shapes, per_doc, preds = [], [], []
    with torch.no_grad():
        for start in range(0, table.num_rows, 16):
            b = make_batch(table.slice(start, 16), vocab, 20)
            for doc_id, s, links in zip(b.doc_ids, link_scores(model, b), b.links, strict=True):
                shapes.append((doc_id, *s.shape, links))
                preds.append((doc_id, s))
                m = document_metrics(doc_id, s, links)
                if m is not None:
                    per_doc.append(m)
    assert [p["doc_id"] for p in got["predictions"]] == [d for d, _ in preds]
    for p, (_, s) in zip(got["predictions"], preds, strict=True):
        np.testing.assert_allclose(np.array(p["scores"]).reshape(s.shape), s, atol=2e-4)
    assert [d["doc_id"] for d in got["per_doc"]] == [m.doc_id for m in per_doc]
    assert got["random"] == random_baseline(shapes, 3)
    assert got["model"] == pytest.approx(summarize(per_doc), rel=1e-4, abs=1e-4)


def test_label_check_and_report_cards_stream(dataset):
    from schemas.shards import has_labels
    from training.report import document_cards

    paths = paths_of(dataset, "test")
    split = feature_bytes(paths)
    assert has_labels(paths)
    unlabelled = write_dataset(
        dataset.parent / "unlabelled",
        {
            "test": [
                Document(d.doc_id, d.source, d.split, d.sentences, d.images, None)
                for d in documents("test", 20, 5)
            ]
        },
        per_shard=5,
    )
    assert not has_labels(paths_of(unlabelled, "test"))
    ids = read_table(paths, ["doc_id"]).column("doc_id").to_pylist()
    per_doc = [{"doc_id": d, "auc": i / len(ids)} for i, d in enumerate(ids[::-1])]

    class Model(torch.nn.Module):  # what the cards call: cfg, eval, encode
        cfg = type("Cfg", (), {})()  # the default backbone

        def encode(self, batch):
            return torch.ones(len(batch.lengths), 4), torch.ones(len(batch.features), 4)

    from training.text import Vocabulary

    with arrow_peak() as peak:
        cards = document_cards(Model(), Vocabulary.build(WORDS, 1), paths, 20, per_doc, limit=4)
    assert len(cards) == 4
    chosen = sorted([*ids[:2], *ids[-2:]])
    assert [c for c in chosen if any(c in card for card in cards)] == chosen
    assert peak[0] < 0.35 * split, (peak[0], split)  # a shard at a time; the whole read held it all


def test_iter_tables_gives_read_tables_rows(dataset):
    paths = paths_of(dataset, "val")
    whole = read_table(paths, TRAINING_COLUMNS)
    parts = list(iter_tables(paths, 17, TRAINING_COLUMNS))
    assert max(t.num_rows for t in parts) <= 17
    assert pa.concat_tables(parts).equals(whole)
