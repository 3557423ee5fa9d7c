"""Each DoFn and element function of the link job on its own, and the batched scorer against
the per-document scores of training.data.link_scores."""

import json
import math
import pickle
from types import SimpleNamespace

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.ml.inference.base import PredictionResult
from hypothesis import given, settings
from hypothesis import strategies as st

from linking.config import LinkConfig
from linking.steps import (
    EVAL,
    Chunk,
    ChunkCoder,
    EvalTotals,
    LinkChunk,
    ReadChunks,
    WriteLinkShards,
    check_document,
    chunks_of,
    documents_of_table,
    raw_chunks,
    row_groups,
    rows_of_block,
)
from schemas.errors import MmlinksError
from tests.linking.conftest import read_links
from training.metrics import DocMetrics, link_prf, summarize


def doc(doc_id: str, n: int = 2, m: int = 3, dim: int = 4, links=None, split: str = "test") -> dict:
    rng = np.random.default_rng(len(doc_id))
    return {
        "doc_id": doc_id,
        "split": split,
        "sentences": [f"sentence {i}" for i in range(n)],
        "features": rng.standard_normal((m, dim)).astype(np.float32),
        "links": links,
        "shard": "s.parquet",
    }


def outputs(gen):
    """(main outputs, {tag: tagged values})."""
    main, tagged = [], {}
    for x in gen:
        if hasattr(x, "tag"):
            tagged.setdefault(x.tag, []).append(x.value)
        else:
            main.append(x)
    return main, tagged


def test_check_document_names_each_reason():
    assert check_document(doc("ok"), 4, 10, 10) is None
    assert check_document(doc("e", n=0), 4, 10, 10)[0] == "empty_document"
    assert check_document(doc("e", m=0), 4, 10, 10)[0] == "empty_document"
    assert check_document(doc("big", m=11), 4, 10, 10)[0] == "too_large"
    assert check_document(doc("w", dim=5), 4, 10, 10) == (
        "wrong_feature_width",
        "features of width 5, the model takes 4",
    )
    bad = doc("nan")
    bad["features"][0, 0] = np.nan
    assert check_document(bad, 4, 10, 10)[0] == "non_finite_features"


def test_chunks_keep_order_and_dead_letter_the_rest():
    docs = [doc("a"), doc("b", n=0), doc("c"), doc("d", dim=3)]
    main, tagged = outputs(chunks_of(docs, "s#0", (4, 10, 10)))
    assert [[d["doc_id"] for d in c.docs] for c in main] == [["a", "c"]]
    assert [(r.source_id, r.reason) for r in tagged["dead_letter"]] == [
        ("b", "empty_document"),
        ("d", "wrong_feature_width"),
    ]


def test_raw_chunks_sort_by_id_and_cut_fixed_chunks():
    docs = [doc(x) for x in "edcba"]
    main, _ = outputs(raw_chunks((3, docs), 2, (4, 10, 10)))
    assert [[d["doc_id"] for d in c.docs] for c in main] == [["a", "b"], ["c", "d"], ["e"]]
    assert {d["shard"] for c in main for d in c.docs} == {"links-00003.parquet"}


def test_documents_of_a_table_with_mixed_widths_are_kept_for_the_dead_letter():
    images = [[{"features": [1.0, 2.0]}], [{"features": [1.0, 2.0, 3.0]}, {"features": [1.0]}]]
    table = pa.table(
        {
            "doc_id": ["a", "b"],
            "split": ["test", "test"],
            "sentences": [["x"], ["y"]],
            "images": images,
            "links": [[{"sentence": 0, "image": 0}], None],
        }
    )
    a, b = documents_of_table(table, "s")
    assert a["features"].shape == (1, 2) and a["links"] == [(0, 0)] and b["links"] is None
    assert check_document(a, 2, 9, 9) is None
    assert check_document(b, 2, 9, 9) == (
        "wrong_feature_width",
        "features of width ragged, the model takes 2",
    )


def test_a_damaged_stored_vector_dead_letters_its_document_only():
    """Schema v3 stores each vector as bytes: one whose length is not a whole number of
    float32 values (a foreign or damaged writer) is a ``corrupt_features`` dead letter; the
    other documents of the table are read as usual (row by row)."""
    data = np.asarray([1, 2], "<f4").tobytes() + b"\x00" * 6 + np.asarray([3, 4], "<f4").tobytes()
    offsets = pa.array([0, 8, 14, 22], pa.int32()).buffers()[1]
    vectors = pa.BinaryArray.from_buffers(pa.binary(), 3, [None, offsets, pa.py_buffer(data)])
    images = pa.ListArray.from_arrays(
        pa.array([0, 1, 2, 3], pa.int32()), pa.StructArray.from_arrays([vectors], ["features"])
    )
    table = pa.table(
        {
            "doc_id": ["a", "b", "c"],
            "split": ["test"] * 3,
            "sentences": [["x"], ["y"], ["z"]],
            "images": images,
        }
    ).replace_schema_metadata({b"mmlinks.feature_dtype": b"float32"})
    a, b, c = documents_of_table(table, "s")
    assert a["features"].tolist() == [[1.0, 2.0]] and check_document(a, 2, 9, 9) is None
    assert c["features"].tolist() == [[3.0, 4.0]] and check_document(c, 2, 9, 9) is None
    assert check_document(b, 2, 9, 9) == (
        "corrupt_features",
        "a stored feature vector is not a whole number of float32 values",
    )


def test_read_chunks_decodes_a_units_row_groups_in_parallel_and_keeps_file_order(tmp_path):
    """Units of two row groups, decoded on two threads, give the chunks of a plain read: each
    row group cut into ``batch_docs`` chunks, in file order, with their features."""
    import pyarrow.parquet as pq

    from schemas.document import Document, ImageRecord
    from schemas.shards import documents_to_table

    rng = np.random.default_rng(0)
    docs = [
        Document(
            f"d{i}",
            "src",
            "test",
            ["a b", "c"],
            [ImageRecord(f"c{i}-{j}", None, 1, 1, 0, rng.random(4).tolist()) for j in range(1 + i % 3)],
            [],
        )
        for i in range(5)
    ]
    pq.write_table(documents_to_table(docs), tmp_path / "s.parquet", row_group_size=2, compression="zstd")
    units = row_groups(("s.parquet", "out.parquet"), str(tmp_path))
    assert units == [("s.parquet", "out.parquet", (0, 1)), ("s.parquet", "out.parquet", (2,))]
    fn = ReadChunks(str(tmp_path), batch_docs=1, limits=(4, 9, 9), evaluate=False)
    fn.setup()
    try:
        chunks = [c for unit in units for c in fn.process(unit)]
    finally:
        fn.teardown()
    assert [c.key for c in chunks] == [
        "out.parquet#0.0",
        "out.parquet#0.1",
        "out.parquet#1.0",
        "out.parquet#1.1",
        "out.parquet#2.0",
    ]
    got = [d for c in chunks for d in c.docs]
    assert [d["doc_id"] for d in got] == [d.doc_id for d in docs]
    for d, want in zip(got, docs, strict=True):
        assert d["shard"] == "out.parquet" and d["links"] is None
        np.testing.assert_array_equal(
            d["features"], np.array([im.features for im in want.images], np.float32)
        )


def test_link_chunk_rows_and_evaluation_records():
    docs = [doc("a", n=2, m=3, links=[(0, 1)]), doc("b", n=1, m=1)]
    scores = [np.array([[0.9, 0.1, 0.2], [0.1, 0.8, 0.7]], np.float32), np.array([[0.3]], np.float32)]
    result = PredictionResult(Chunk("k", docs).without_features(), scores, "m")
    main, tagged = outputs(LinkChunk("matching", 0.35, True, True).process(result))
    [(shard, block)] = main  # one block of rows per output shard of the chunk
    a, b = rows_of_block(block)
    assert shard == "s.parquet"
    # the best 2-edge matching is (0, 0) + (1, 1) = 1.7; image 2 stays out of it
    assert a["sentence"] == [0, 1, None] and a["score"] == pytest.approx([0.9, 0.8, None])
    assert b["sentence"] == [None] and b["score"] == [None]  # its only link scores 0.3 < 0.35
    assert a["scores"] == [pytest.approx(r) for r in scores[0].tolist()] and b["scores"] == [
        [pytest.approx(0.3)]
    ]
    [record] = tagged[EVAL]  # only the labelled document
    assert (record["tp"], record["predicted"], record["gold"]) == (0, 2, 1)
    # the true cell (0, 1) scores 0.1: it ties one of the five negatives and loses to the rest
    assert record["metrics"]["auc"] == pytest.approx(0.1)


_unit = st.floats(0, 1, allow_nan=False)
_record = st.builds(
    lambda i, tp, extra, miss, m: {
        "doc_id": f"d{i}",
        "tp": tp,
        "predicted": tp + extra,
        "gold": tp + miss,
        "metrics": None if m is None else {"doc_id": f"d{i}", "auc": m[0], "p_at_1": m[1], "p_at_5": m[2]},
    },
    st.integers(0, 10**6),
    st.integers(0, 5),
    st.integers(0, 5),
    st.integers(0, 5),
    st.none() | st.tuples(_unit, _unit, _unit),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_record, max_size=40), st.randoms(use_true_random=False))
def test_eval_totals_match_the_per_document_oracle_in_any_grouping(records, rnd):
    """The combined totals equal ``summarize`` / ``link_prf`` over every record held at once
    (the job's evaluation before #47), and are the same bytes whatever the bundling."""
    fn = EvalTotals()

    def combine(recs):
        parts = [recs[i::3] for i in range(3)]  # three bundles, merged
        accs = []
        for part in parts:
            acc = fn.create_accumulator()
            for r in part:
                acc = fn.add_input(acc, r)
            accs.append(acc)
        return fn.extract_output(fn.merge_accumulators(accs))

    got = combine(records)
    shuffled = list(records)
    rnd.shuffle(shuffled)
    assert json.dumps(combine(shuffled), sort_keys=True) == json.dumps(got, sort_keys=True)
    per_doc = [DocMetrics(**r["metrics"]) for r in records if r["metrics"] is not None]
    want_links = link_prf(*(sum(r[k] for r in records) for k in ("tp", "predicted", "gold")))
    want_scores = summarize(per_doc)
    assert got["labelled_documents"] == len(records)
    assert got["links"] == pytest.approx(want_links, nan_ok=True)
    assert got["scores"] == pytest.approx(want_scores, nan_ok=True, abs=1e-9)


def test_eval_totals_take_a_non_finite_metric_as_nan_not_a_crash():
    """``Fraction`` refuses NaN: a diverged document makes that mean NaN (as ``summarize`` gives)."""
    fn = EvalTotals()
    good = {"tp": 1, "predicted": 1, "gold": 2, "metrics": {"auc": 0.5, "p_at_1": 1.0, "p_at_5": 0.2}}
    bad = {"tp": 0, "predicted": 1, "gold": 1, "metrics": {"auc": float("nan"), "p_at_1": 0.0, "p_at_5": 0.0}}
    accs = [fn.add_input(fn.create_accumulator(), r) for r in (good, bad)]
    out = fn.extract_output(fn.merge_accumulators(accs))
    assert math.isnan(out["scores"]["auc"]) and out["scores"]["p_at_1"] == pytest.approx(50.0)
    assert out["labelled_documents"] == 2 and out["links"]["true_positives"] == 1


def test_chunk_coder_round_trips_and_sizes_without_encoding(monkeypatch):
    chunk = Chunk("s#0", [doc("a", m=3, dim=4), doc("b", m=2, dim=4)])
    coder = ChunkCoder()
    back = coder.decode(coder.encode(chunk))
    assert back.key == "s#0" and [d["doc_id"] for d in back.docs] == ["a", "b"]
    np.testing.assert_array_equal(back.docs[1]["features"], chunk.docs[1]["features"])
    assert isinstance(beam.coders.registry.get_coder(Chunk), ChunkCoder)  # a Chunk PCollection's
    monkeypatch.setattr(ChunkCoder, "encode", lambda *_: pytest.fail("sizing a chunk encoded it"))
    size = coder.get_impl().estimate_size(chunk)
    assert size >= (3 + 2) * 4 * 4  # at least the features' bytes
    scored = chunk.without_features()
    assert all("features" not in d for d in scored.docs) and "features" in chunk.docs[0]
    assert coder.get_impl().estimate_size(scored) < size


def test_write_link_shards_sorts_rows_and_is_byte_stable(tmp_path):
    rows = [
        {
            "doc_id": d,
            "split": "test",
            "n_sentences": 1,
            "n_images": 1,
            "sentence": [0],
            "score": [0.5],
            "scores": None,
        }
        for d in ("b", "a")
    ]
    blocks = [pickle.dumps(r) for r in (rows, rows[1:], rows[:1])]  # as LinkChunk yields them
    [info1] = WriteLinkShards(str(tmp_path / "1")).process(("x.parquet", blocks[:1]))
    [info2] = WriteLinkShards(str(tmp_path / "2")).process(("x.parquet", blocks[1:]))
    assert info1 == info2 and json.loads(info1)["rows"] == 2
    assert read_links([tmp_path / "1" / "x.parquet"]).column("doc_id").to_pylist() == ["a", "b"]


def test_batched_scores_equal_per_document_scores(dataset, tmp_path):
    import torch

    from linking.model import LinkScorer
    from schemas.manifest import Manifest
    from schemas.shards import read_table
    from tests.linking.conftest import write_checkpoint
    from training.checkpoints import load_checkpoint_model
    from training.data import TRAINING_COLUMNS, link_scores, make_batch
    from training.text import Vocabulary

    manifest = Manifest.read(dataset)
    table = read_table(manifest.shard_paths(dataset, "test"), TRAINING_COLUMNS)
    vocab = Vocabulary.build([s for d in table.column("sentences").to_pylist() for s in d], min_count=1)
    model, _ = load_checkpoint_model(
        write_checkpoint(tmp_path / "ckpt", vocab, manifest.feature_extractor.dim, 1)
    )
    scorer = LinkScorer(SimpleNamespace(model=model, vocab=vocab, max_tokens=20))
    docs = documents_of_table(read_table(manifest.shard_paths(dataset, "test")), "t")
    with torch.no_grad():
        expected = link_scores(model, make_batch(table, vocab, 20))
    for got, want in zip(scorer.score(docs), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_link_config_refuses_bad_combinations():
    with pytest.raises(MmlinksError, match="exactly one of --data"):
        LinkConfig(model="models:/m@production", out="o")
    with pytest.raises(MmlinksError, match="--input needs --source"):
        LinkConfig(model="models:/m@production", out="o", input="raw")
    with pytest.raises(MmlinksError, match=r"min_score 2\.0 \(a cosine in \[-1, 1\] or 'off'\)"):
        LinkConfig(model="models:/m@production", out="o", data="d", min_score=2.0)
    with pytest.raises(MmlinksError, match="assign 'greedy'"):
        LinkConfig(model="models:/m@production", out="o", data="d", assign="greedy")
