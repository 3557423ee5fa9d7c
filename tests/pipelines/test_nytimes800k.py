"""The NYTimes800k source (issue #18): mongoexport'ed ``articles`` documents -> one news sample
per image position, extended JSON ids and dates, the release / date / ratio splits, dead letters
for every document it does not keep (a hypothesis property), the Beam graph on the fixture in the
real layout, and one real build of that fixture."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.direct_runner import DirectRunner
from pipelines.records import DEAD_LETTER, RawDocument
from pipelines.sources import get_spec
from pipelines.sources.news_jsonl import SplitRule
from pipelines.sources.nytimes800k import ReadNYTimes800k, ext_date, ext_id, parse_line
from schemas.errors import MmlinksError

ROOT = Path(__file__).parents[1] / "fixtures" / "nytimes800k"
A, B = "5c8a1f3a95d0e0246f3b7e01", "5d1e2f3a95d0e0246f3b7e02"


def test_extended_json_ids_and_dates():
    assert ext_id({"$oid": "5d1e"}) == ext_id("5d1e ") == "5d1e"
    assert ext_date({"$date": "2019-03-14T09:00:05Z"}) == "2019-03-14"
    assert ext_date({"$date": {"$numberLong": "1562025600000"}}) == "2019-07-02"
    assert ext_date("2019-07-05T00:00:00+0000") == "2019-07-05"
    assert ext_date({"$date": "yesterday"}) == ext_date(None) == ext_date(5) == ""


def test_a_document_gives_one_sample_per_image_position():
    line = (ROOT / "articles.json").read_text().splitlines()[0]
    docs = list(parse_line(line, "/data", "images_processed", SplitRule("release")))
    assert [d.doc_id for d in docs] == [f"{A}#0", f"{A}#1"]
    first = docs[0]
    assert first.split == "train" and first.metadata["date"] == "2019-03-14"
    assert first.metadata["news_sources"] == "headline,lead,body,caption"
    assert first.sentences[0] == "Ferry Service Expands to the Bronx"
    assert first.sentences[2].split("\n") == [
        "The ferry left the pier at dawn with its first riders.",
        "Officials said the route would run every half hour.",
    ]  # the paragraphs only, captions are not body text
    assert first.sentences[3] == "Riders boarding the ferry at Soundview."
    assert first.image_uris[0].startswith("/data/images_processed/0a1b") and docs[1].sentences[3].startswith(
        "The new"
    )
    by_date = list(parse_line(line, "/d", "i", SplitRule("date", "2019-03-01", "2019-06-01")))
    assert {d.split for d in by_date} == {"val"}
    # an image hash that is not a hex digest names no image (it would become a path)
    doc = json.loads(line)
    doc["parsed_section"][doc["image_positions"][0]]["hash"] = "../../etc/passwd"
    out = list(parse_line(json.dumps(doc), "/data", "images_processed", SplitRule("release")))
    assert out[0] == (f"{A}#0", "no_image_uri", "") and out[1].doc_id == f"{A}#1"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
sections = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["paragraph", "caption", "x"]) | json_values, "text": json_values},
        optional={"hash": st.text(max_size=6) | json_values},
    )
    | json_values,
    max_size=4,
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "_id": st.text(max_size=6) | st.fixed_dictionaries({"$oid": json_values}) | json_values,
        "headline": st.fixed_dictionaries({"main": json_values}) | json_values,
        "abstract": json_values,
        "pub_date": st.fixed_dictionaries({"$date": json_values}) | st.text(max_size=25) | json_values,
        "split": st.sampled_from(["train", "valid", "test", "dev"]) | json_values,
        "parsed_section": sections | json_values,
        "image_positions": st.lists(st.integers(-2, 5) | json_values, max_size=4) | json_values,
    },
)


@settings(max_examples=30, deadline=None)
@given(
    st.one_of(documents.map(json.dumps), json_values.map(json.dumps), st.text(max_size=40)),
    st.sampled_from(
        [SplitRule("release"), SplitRule("date", "2019-01-01", "2019-06-01"), SplitRule("ratio")]
    ),
)
def test_any_line_gives_samples_or_reasoned_dead_letters(line, rule):
    out = list(parse_line(line, "/r", "images_processed", rule))  # never raises
    for item in out:
        if isinstance(item, RawDocument):
            assert (
                item.sentences
                and item.image_uris[0].endswith(".jpg")
                and item.split in ("train", "val", "test")
            )
            assert len(item.sentences) == len(item.metadata["news_sources"].split(","))
        else:
            source_id, reason, _ = item
            assert isinstance(source_id, str) and reason in {
                "malformed_record",
                "no_images",
                "no_image_uri",
                "no_text",
                "no_release_split",
            }


def test_read_nytimes800k_graph_on_the_fixture():
    spec = get_spec("nytimes800k")
    ctx = spec.context(str(ROOT), {}, str(ROOT / "state"))
    with TestPipeline(runner=DirectRunner()) as p:
        out = p | ReadNYTimes800k(ctx)
        docs = out["documents"] | beam.Map(
            lambda d: (d.doc_id, d.metadata["news_sources"], d.metadata["date"], d.split)
        )
        reasons = out[DEAD_LETTER] | beam.Map(lambda d: d.reason)
        want = [
            (f"{A}#0", "headline,lead,body,caption", "2019-03-14", "train"),
            (f"{A}#1", "headline,lead,body,caption", "2019-03-14", "train"),
            (f"{B}#0", "headline,body", "2019-07-02", "test"),  # an empty caption: the source is absent
        ]
        assert_that(docs, equal_to(want), label="docs")
        # position 7 is outside parsed_section; the third article has no split; a cut line
        assert_that(reasons, equal_to(["no_image_uri", "no_release_split", "malformed_record"]), label="dead")
    with pytest.raises(MmlinksError, match="val_from"):
        spec.check(spec.context(str(ROOT), {"split": "date"}, "s"))
    with pytest.raises(MmlinksError, match="mongoexport"):
        spec.check(spec.context(str(ROOT / "images_processed"), {}, "s"))


@pytest.mark.slow  # a whole build (image store, features, shards, commit): ~10 s unloaded
def test_the_fixture_builds_into_a_dataset(tmp_path):
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig

    manifest = build_dataset(BuildConfig(source="nytimes800k", input=str(ROOT), out=str(tmp_path / "ds")))
    assert manifest.source == "nytimes800k"
    assert {k: v for k, v in manifest.counts["splits"].items() if v} == {"train": 2, "test": 1}
    dropped = manifest.counts["dropped"]
    assert all(
        dropped.get(k) == 1
        for k in ("line:malformed_record", "document:no_release_split", "document:no_image_uri")
    )
