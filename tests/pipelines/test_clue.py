"""The Clue source on fixtures in the released CSV format (tests/fixtures/clue/)."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from pipelines.records import DEAD_LETTER, RawDocument
from pipelines.sources import get_spec
from pipelines.sources.clue import RELATIONS, ReadClue, hosts_of, parse_clue_csv

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clue"


def test_rows_become_pairs_with_relations_and_bad_rows_dead_letters():
    out = list(parse_clue_csv((FIXTURES / "train.csv").read_text(), str(FIXTURES / "train.csv")))
    docs = [d for d in out if isinstance(d, RawDocument)]
    dead = [d for d in out if not isinstance(d, RawDocument)]
    assert [d.doc_id for d in docs] == ["clue-train-12", "clue-train-57", "clue-train-90"]
    horse = docs[0]
    assert horse.sentences == ["young horse grazing in the forest"] and horse.links == [(0, 0)]
    assert horse.image_uris == ["https://img.example-cdn.org/photos/12.jpg"] and horse.split is None
    assert horse.metadata["relations"] == "Visible,Action"
    assert docs[1].metadata["relations"] == "Story" and docs[1].metadata["clue_when"] == "1"
    assert docs[2].metadata["clue_comment"] == "lovely"
    assert [(sid, reason) for sid, reason, _ in dead] == [
        ("train:113", "no_caption"),
        ("train:150", "bad_url"),
        ("train:171", "bad_label"),
    ]
    (test_doc,) = parse_clue_csv((FIXTURES / "test.csv").read_text(), "test.csv")
    assert test_doc.split == "test" and test_doc.metadata["relations"] == "Visible,Meta"


def test_a_file_without_the_columns_is_refused_as_a_whole():
    assert list(parse_clue_csv("caption,url\na,http://x/y.jpg\n", "odd.csv")) == [
        (
            "odd.csv",
            "bad_header",
            "missing columns ['index', 'Visible', 'Subjective', 'Action', 'Story', "
            "'Meta', 'Irrelevant', 'Other', 'When', 'How', 'Where', 'Comment']",
        )
    ]


def test_spec_vocabulary_hosts_and_beam_transform(tmp_path):
    spec = get_spec("clue")
    ctx = spec.context(str(FIXTURES), {}, str(tmp_path / "state"))
    spec.check(ctx)
    assert spec.relations(ctx) == list(RELATIONS)
    assert hosts_of(str(FIXTURES)) == {"img.example-cdn.org", "media.example.net"}
    with beam.Pipeline() as p:
        out = p | ReadClue(str(FIXTURES))
        assert_that(
            out.documents | beam.Map(lambda d: d.doc_id),
            equal_to(["clue-train-12", "clue-train-57", "clue-train-90", "clue-test-7"]),
            label="docs",
        )
        assert_that(
            out[DEAD_LETTER] | beam.Map(lambda d: d.reason),
            equal_to(["no_caption", "bad_url", "bad_label"]),
            label="dead",
        )
