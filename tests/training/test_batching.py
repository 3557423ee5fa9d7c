"""Batches of similar documents (``--batch-sampling similar``, issue #44)."""

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import InMemoryShard
from training.epoch_batches import document_batches, document_signatures, similar_batches


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 120),
    batch=st.integers(2, 16),
    share=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_every_row_lands_in_exactly_one_batch_of_at_most_batch_docs(n, batch, share, seed):
    rng = np.random.default_rng(seed)
    sigs = rng.normal(size=(n, 8)).astype(np.float32)
    batches = similar_batches(sigs, batch, share, rng)
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(n))
    assert all(1 <= len(b) <= batch for b in batches)
    assert sum(len(b) < batch for b in batches) <= 1  # only the last batch may be short


def _clustered(n_clusters=8, per=20, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_clusters, dim))
    labels = np.repeat(np.arange(n_clusters), per)
    sigs = centres[labels] + 0.1 * rng.normal(size=(len(labels), dim))
    return sigs / np.linalg.norm(sigs, axis=1, keepdims=True), labels


def test_near_share_sets_how_much_of_a_batch_shares_its_first_documents_cluster():
    sigs, labels = _clustered()

    def same_cluster(share):
        batches = similar_batches(sigs, 11, share, np.random.default_rng(1))
        full = [b for b in batches if len(b) == 11]
        return np.mean([np.mean(labels[b[1:]] == labels[b[0]]) for b in full])

    assert same_cluster(0.0) < 0.3  # random: ~1/8 of a batch shares the first document's cluster
    assert same_cluster(0.5) >= 0.4  # the last batches of a chunk find their clusters used up
    assert same_cluster(1.0) > 0.8  # clusters of 20: the second batch of one tops up from others


def test_signatures_group_documents_by_look_and_words():
    rng = np.random.default_rng(0)
    looks = {t: rng.normal(size=16) * 5 for t in "ab"}
    feats = [looks[t] + rng.normal(size=(4, 16)) for t in "aabb"]
    words = {"a": "walnut bookshelf", "b": "garden planter"}
    sents = [[f"the digit {d} for the {words[t]}"] for t, d in zip("aabb", ["one", "two", "three", "four"])]
    sigs = document_signatures([f.astype(np.float32) for f in feats], sents)
    sims = sigs @ sigs.T
    assert sims[0, 1] > sims[0, 2] and sims[2, 3] > sims[2, 1]


def test_similar_sampling_yields_every_document_once_in_full_batches():
    rng = np.random.default_rng(0)
    feats = [rng.normal(size=(3, 4)).astype(np.float32) for _ in range(50)]
    table = pa.table(
        {
            "doc_id": [f"d{i:03d}" for i in range(50)],
            "sentences": [[f"word{i % 5} x", "y"] for i in range(50)],
            "images": [[{"features": f.tolist()} for f in doc] for doc in feats],
            "links": [None] * 50,
        }
    )
    batches = list(document_batches(InMemoryShard(table), 11, np.random.default_rng(3), "similar", 0.5))
    ids = [i for b in batches for i in b.column("doc_id").to_pylist()]
    assert sorted(ids) == sorted(table.column("doc_id").to_pylist())
    assert [b.num_rows for b in batches] == [11, 11, 11, 11, 6]
