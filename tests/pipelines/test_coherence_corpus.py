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
        "schema_version": 2,
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
