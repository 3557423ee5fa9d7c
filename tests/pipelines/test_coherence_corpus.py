"""The synthetic coherence corpus and the pair-dataset representation (relation vocabulary in
the manifest, relations per pair in the document metadata)."""

from __future__ import annotations

import json

import pytest

from pipelines.coherence_corpus import (
    ACTION_CUES,
    RELATIONS,
    RESULT_CUES,
    CoherenceSynthConfig,
    generate_pair,
    write_coherence_corpus,
)
from schemas.document import SCHEMA_VERSION
from schemas.errors import MmlinksError
from schemas.manifest import Manifest, pair_relations


def test_pairs_are_reproducible_and_labelled_consistently():
    cfg = CoherenceSynthConfig(pairs=60, seed=3, image_size=48)
    seen = set()
    for i in range(60):
        rec, img = generate_pair(cfg, i)
        again, img2 = generate_pair(cfg, i)
        assert rec == again and img.tobytes() == img2.tobytes()
        assert len(rec["sentences"]) == 1 and len(rec["images"]) == 1 and rec["links"] == [[0, 0]]
        labels = rec["metadata"]["relations"].split(",")
        assert set(labels) <= set(RELATIONS)
        assert ("Visible" in labels) != ("Action" in labels)  # exactly one state
        words = set(rec["sentences"][0].split())
        if "Action" in labels:
            assert not words & set(RESULT_CUES)
        else:
            assert not words & set(ACTION_CUES)
        seen.update(labels)
    assert seen == set(RELATIONS)


def test_cue_lists():
    from pipelines.coherence_corpus import cue_list

    assert cue_list(True, 3) == ACTION_CUES[:3]
    many = cue_list(False, 10)
    assert many[:8] == RESULT_CUES and many[8:] == ("fin01", "fin02")


def test_written_corpus_carries_the_vocabulary(tmp_path):
    write_coherence_corpus(tmp_path, CoherenceSynthConfig(pairs=3, image_size=32))
    meta = json.loads((tmp_path / "corpus.json").read_text())
    assert meta["relations"] == list(RELATIONS)
    lines = (tmp_path / "documents.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all((tmp_path / json.loads(x)["images"][0]).exists() for x in lines)


def test_synthetic_source_reads_the_vocabulary(tmp_path):
    from pipelines.sources.synthetic import SPEC

    write_coherence_corpus(tmp_path / "coh", CoherenceSynthConfig(pairs=2, image_size=32))
    ctx = SPEC.context(str(tmp_path / "coh"), {}, str(tmp_path / "state"))
    assert SPEC.relations(ctx) == list(RELATIONS)
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "corpus.json").write_text(json.dumps({"format": "mmlinks-synthetic/1"}))
    assert SPEC.relations(SPEC.context(str(tmp_path / "link"), {}, str(tmp_path / "state"))) is None


def _manifest(**extra) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "dataset_version": "v",
        "source": "synthetic",
        "counts": {},
        "feature_extractor": {"name": "x", "version": "1", "dim": 4},
        "shards": [],
        **extra,
    }


def test_manifest_relations_round_trip_and_link_datasets_are_unchanged():
    plain = Manifest.from_dict(_manifest())
    assert plain.relations is None and "relations" not in json.loads(plain.to_json())
    with pytest.raises(MmlinksError, match="coherence-labelled pair dataset"):
        plain.relation_names("--objective cmcm")
    coh = Manifest.from_dict(_manifest(relations=["Visible", "Story"]))
    assert Manifest.from_dict(json.loads(coh.to_json())).relations == ["Visible", "Story"]
    for bad in (["a,b"], ["x", "x"], "Visible", [""]):
        with pytest.raises(MmlinksError, match="malformed"):
            Manifest.from_dict(_manifest(relations=bad))


def test_pair_relations_refuses_unknown_names():
    assert pair_relations("Story,Visible", ["Visible", "Action", "Story"]) == [1, 0, 1]
    assert pair_relations("", ["Visible"]) == [0]
    with pytest.raises(MmlinksError, match="Meta"):
        pair_relations("Meta", ["Visible"])


def test_the_default_corpus_is_unchanged_by_the_split_options():
    """Records and pixels of the default corpus, pinned before --objects / --split-sizes /
    --train-states existed: datasets built from it keep their bytes."""
    import hashlib

    cfg = CoherenceSynthConfig(pairs=12, seed=1, image_size=32)
    digest = hashlib.sha256()
    for i in range(12):
        rec, img = generate_pair(cfg, i)
        digest.update(json.dumps(rec, sort_keys=True).encode())
        digest.update(img.tobytes())
        assert "split" not in rec
    assert digest.hexdigest() == "8ac2e244ac294def36f6428ae882c2953b62dfd1d9375351031eeff51d2d0fa3"


def _states(records, split_names):
    """{object: set of states} over the records of the given splits."""
    out: dict[str, set[str]] = {}
    for rec in records:
        if rec["split"] in split_names:
            state = "Action" if "Action" in rec["metadata"]["relations"] else "Visible"
            out.setdefault(rec["metadata"]["object"], set()).add(state)
    return out


def test_train_states_one_shows_each_object_in_one_state_in_training_only(tmp_path):
    from pipelines.coherence_corpus import object_pool
    from pipelines.splits import sized_assignment, split_rank_key

    kw = dict(pairs=160, seed=2, image_size=32, objects=6, split_sizes={"val": 30, "test": 50})
    cfg = CoherenceSynthConfig(train_states="one", **kw)
    write_coherence_corpus(tmp_path, cfg)
    records = [json.loads(x) for x in (tmp_path / "documents.jsonl").read_text().splitlines()]
    assert [sum(r["split"] == s for r in records) for s in ("train", "val", "test")] == [80, 30, 50]
    ids = sorted((r["doc_id"] for r in records), key=split_rank_key)  # as `data build --split-sizes`
    assert {r["doc_id"]: r["split"] for r in records if r["split"] != "train"} == sized_assignment(
        ids, {"val": 30, "test": 50}
    )
    pool, action_objects = object_pool(2, 6, 0.5)
    assert (
        len(pool) == 6
        and len(action_objects) == 3
        and {r["metadata"]["object"] for r in records} == {f"{c} {s}" for c, s in pool}
    )
    train = _states(records, {"train"})
    assert len(train) == 6 and all(len(states) == 1 for states in train.values())
    assert {o for o, states in train.items() if states == {"Action"}} == {
        f"{c} {s}" for c, s in action_objects
    }
    held_out = _states(records, {"val", "test"})
    assert sum(len(states) == 2 for states in held_out.values()) >= 5  # both states outside training
    # Outside training, and for training pairs already in their object's state, nothing changes.
    both = CoherenceSynthConfig(**kw)
    for i, rec in enumerate(records):
        again, _ = generate_pair(both, i, rec["split"])
        if rec["split"] != "train" or again["metadata"]["relations"] == rec["metadata"]["relations"]:
            assert again == rec
        else:
            assert again["metadata"]["object"] == rec["metadata"]["object"]


def test_train_states_one_needs_the_splits():
    with pytest.raises(MmlinksError, match="--split-sizes"):
        CoherenceSynthConfig(train_states="one")
    with pytest.raises(MmlinksError, match="train_states"):
        CoherenceSynthConfig(train_states="two", split_sizes={"test": 1})
    with pytest.raises(MmlinksError, match="split_sizes"):
        CoherenceSynthConfig(split_sizes={"dev": 1})


def test_the_synthetic_build_keeps_the_generators_splits(tmp_path):
    """Read -> splits stages of the build graph: a written split wins over the build's
    --split-sizes; a record without one is split by the build as before; a bad one is a dead letter."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from pipelines.build_config import BuildConfig
    from pipelines.direct_runner import DirectRunner
    from pipelines.graph import assign_splits
    from pipelines.records import DEAD_LETTER
    from pipelines.sources.synthetic import ReadSyntheticCorpus

    cfg = CoherenceSynthConfig(pairs=12, image_size=32, split_sizes={"val": 2, "test": 3})
    write_coherence_corpus(tmp_path, cfg)
    written = [json.loads(x) for x in (tmp_path / "documents.jsonl").read_text().splitlines()]
    expected = [(r["doc_id"], r["split"]) for r in written]
    unsplit = {**written[0], "doc_id": "no-split"}
    del unsplit["split"]
    bad = {**written[0], "doc_id": "bad", "split": "dev"}
    with (tmp_path / "documents.jsonl").open("a") as fh:
        fh.write(json.dumps(unsplit) + "\n" + json.dumps(bad) + "\n")
    build = BuildConfig(
        source="synthetic", input=str(tmp_path), out=str(tmp_path / "ds"), split_sizes={"test": 1}
    )
    with beam.Pipeline(runner=DirectRunner()) as p:
        read = p | ReadSyntheticCorpus(str(tmp_path))
        docs = read.documents | beam.Map(lambda d: {"doc_id": d.doc_id, "split": d.split})
        split = assign_splits(docs, build) | beam.Map(lambda d: (d["doc_id"], d["split"]))
        assert_that(split, equal_to([*expected, ("no-split", "test")]), label="splits")
        assert_that(
            read[DEAD_LETTER] | beam.Map(lambda d: d.reason), equal_to(["malformed_record"]), label="dead"
        )


def test_the_brush_look_changes_only_in_progress_images():
    half = CoherenceSynthConfig(pairs=16, seed=4, image_size=48)
    brush = CoherenceSynthConfig(pairs=16, seed=4, image_size=48, state_look="brush")
    looks = set()
    for i in range(16):
        (rec, img), (rec2, img2) = generate_pair(half, i), generate_pair(brush, i)
        assert rec == rec2
        action = "Action" in rec["metadata"]["relations"]
        assert (img.tobytes() != img2.tobytes()) == action  # the object is not half covered
        looks.add(action)
    assert looks == {True, False}


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, '{"relations": ' + "9" * 5000 + "}", "{not json"])
def test_a_corpus_json_that_is_too_deep_too_long_or_not_json_is_one_error_line(tmp_path, text):
    from pipelines.sources.base import SourceContext
    from pipelines.sources.synthetic import corpus_relations

    (tmp_path / "corpus.json").write_text(text)
    ctx = SourceContext("synthetic", str(tmp_path), {}, str(tmp_path / "state"))
    with pytest.raises(MmlinksError, match=r"corpus\.json is not JSON") as err:
        corpus_relations(ctx)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("link", ["[0, 1e400]", "[Infinity, 0]", "[NaN, 0]"])
def test_a_synthetic_line_with_an_infinite_link_index_is_a_dead_letter(link):
    """Found by tests/faults/test_stream_fuzz.py: int(float inf) raised OverflowError (uncaught)."""
    from pipelines.records import DEAD_LETTER
    from pipelines.sources.synthetic import ParseSyntheticLine

    line = f'{{"doc_id": "d", "sentences": ["a"], "images": ["a.png"], "links": [{link}]}}'.encode()
    (out,) = ParseSyntheticLine("/corpus").process(line)
    assert out.tag == DEAD_LETTER and out.value.reason == "malformed_record", out


def test_a_synthetic_line_with_an_escaped_lone_surrogate_is_repaired():
    """Found by tests/faults/test_stream_fuzz.py: ``"\\ud800"`` in a doc id or metadata reached
    Beam's coder, whose UnicodeEncodeError failed the whole build."""
    from pipelines.sources.synthetic import ParseSyntheticLine

    line = b'{"doc_id": "d\\ud800", "sentences": ["a"], "images": [], "metadata": {"k\\udc80": "v"}}'
    (doc,) = ParseSyntheticLine("/corpus").process(line)
    assert doc.doc_id == "d\ufffd" and doc.metadata == {"k\ufffd": "v"}
