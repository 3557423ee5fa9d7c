"""The synthetic news corpus and the news JSONL source: the aligned lexicon, the article
generator, the per-image samples, dead letters, the date and ratio splits, and the source's
Beam graph (TestPipeline)."""

from __future__ import annotations

import json

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.direct_runner import DirectRunner
from pipelines.news_corpus import FILLER, GLUE, LEXICON, NEARBY, NewsSynthConfig, generate_article, translate
from pipelines.records import DEAD_LETTER, RawDocument
from pipelines.sources import get_spec
from pipelines.sources.news_jsonl import ReadNewsJsonl, SplitRule, date_cut_points, parse_article
from pipelines.splits import assign_split
from pipelines.synthetic_corpus import COLOURS, PATTERNS, POSITIONS, SHAPES, SIZES
from schemas.errors import MmlinksError
from schemas.news import NEWS_SOURCES, sources_of
from schemas.text import tokenize


def test_the_lexicon_is_one_to_one_and_covers_every_word_written():
    words = {w for g in GLUE.values() for t in g for w in t} | {w for t in FILLER for w in t} | set(NEARBY)
    words |= set(COLOURS) | set(SHAPES) | set(SIZES) | set(PATTERNS)
    words |= {w for p in POSITIONS for w in p.split()}
    assert words <= set(LEXICON)
    assert len(set(LEXICON.values())) == len(LEXICON)  # aligned: one word each way
    assert not set(LEXICON.values()) & set(LEXICON) - {"in"}  # the languages share only "in"


def test_articles_are_reproducible_and_use_one_language():
    cfg = NewsSynthConfig(articles=30, image_size=32, second_image_rate=0.5)
    a, imgs = generate_article(cfg, 7)
    b, _ = generate_article(cfg, 7)
    assert a == b and len(imgs) == len(a["images"]) and imgs[0].size == (32, 32)
    en, de = set(LEXICON), set(LEXICON.values())
    for i in range(30):
        rec, _ = generate_article(cfg, i)
        text = " ".join(
            [rec[s] for s in ("headline", "lead", "body")] + [im["caption"] for im in rec["images"]]
        )
        assert set(tokenize(text)) <= (de if rec["language"] == "de" else en)
        assert rec["headline"]  # every article has one
    dates = [generate_article(cfg, i)[0]["date"] for i in range(30)]
    assert dates == sorted(dates) and dates[0] == "2019-01-01"
    assert translate(["big", "red", "circle"], "de") == ["gross", "rot", "kreis"]
    with pytest.raises(ValueError):
        NewsSynthConfig(start_date="2019-13-01")


ARTICLE = {
    "article_id": "a1",
    "date": "2020-03-01T10:00:00Z",
    "language": "de",
    "headline": "Rot in der Stadt",
    "lead": "",
    "body": "Die Polizei sagte ...",
    "outlet": "zeitung",
    "images": [{"uri": "img/a1-0.jpg", "caption": "Ein roter Kreis"}, {"uri": "https://x.org/a1.jpg"}],
}


def test_an_article_gives_one_sample_per_image():
    docs = list(parse_article(json.dumps(ARTICLE), "/data", SplitRule("date", "2020-02-01", "2020-04-01")))
    assert [d.doc_id for d in docs] == ["a1#0", "a1#1"]
    first, second = docs
    assert first.sentences == ["Rot in der Stadt", "Die Polizei sagte ...", "Ein roter Kreis"]
    assert sources_of(first.metadata) == ["headline", "body", "caption"]
    assert sources_of(second.metadata) == ["headline", "body"]  # no caption: the source is absent
    assert first.links == [(0, 0), (1, 0), (2, 0)] and first.split == second.split == "val"
    assert first.image_uris == ["/data/img/a1-0.jpg"] and second.image_uris == ["https://x.org/a1.jpg"]
    assert first.metadata["date"] == "2020-03-01" and first.metadata["outlet"] == "zeitung"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"date": "soon"}, "malformed_record"),
        ({"article_id": None}, "malformed_record"),
        ({"images": []}, "no_images"),
        ({"language": "fr"}, "language_filtered"),
        ({"headline": "", "body": "...", "images": [{"uri": "a.jpg", "caption": "!!"}]}, "no_text"),
        ({"images": [{"caption": "x"}]}, "no_image_uri"),
    ],
)
def test_bad_articles_are_dead_letters(change, reason):
    rec = {k: v for k, v in {**ARTICLE, **change}.items() if v is not None}
    out = list(parse_article(json.dumps(rec), ".", SplitRule(), frozenset({"de"})))
    assert any(isinstance(o, tuple) and o[1] == reason for o in out)


@settings(max_examples=15, deadline=None)
@given(st.text(min_size=1, max_size=12).filter(str.strip), st.integers(1, 4))
def test_ratio_split_keeps_an_articles_samples_together(article_id, n):
    rec = {
        **ARTICLE,
        "article_id": article_id,
        "images": [{"uri": f"{k}.jpg", "caption": "x"} for k in range(n)],
    }
    docs = list(parse_article(json.dumps(rec), ".", SplitRule("ratio")))
    assert len(docs) == n and len({d.split for d in docs}) == 1


def test_date_split_trains_on_the_past(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(
        "\n".join(json.dumps({"date": f"2020-01-{d:02d}"}) for d in range(1, 21)) + "\nnot json\n"
    )
    val_from, test_from = date_cut_points([str(path)])
    assert (val_from, test_from) == ("2020-01-17", "2020-01-19")
    rule = SplitRule("date", val_from, test_from)
    assert [rule.split("x", d) for d in ("2020-01-16", "2020-01-17", "2020-01-19")] == [
        "train",
        "val",
        "test",
    ]


def test_the_source_checks_its_options(tmp_path):
    spec = get_spec("news-jsonl")
    with pytest.raises(MmlinksError, match=r"no \.jsonl"):
        spec.check(spec.context(str(tmp_path), {}, str(tmp_path / "s")))
    (tmp_path / "a.jsonl").write_text(json.dumps(ARTICLE) + "\n")
    for opts, msg in (({"split": "weekly"}, "split"), ({"split": "ratio", "ratios": "1,2"}, "ratios")):
        with pytest.raises(MmlinksError, match=msg):
            spec.check(spec.context(str(tmp_path), opts, str(tmp_path / "s")))
    with pytest.raises(MmlinksError, match="before"):
        spec.check(spec.context(str(tmp_path), {"val_from": "2020-05-01", "test_from": "2020-01-01"}, "s"))


def test_read_news_jsonl_graph(tmp_path):
    lines = [json.dumps(ARTICLE), json.dumps({**ARTICLE, "article_id": "a2", "language": "en"}), "{oops"]
    (tmp_path / "export.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\n")
    spec = get_spec("news-jsonl")
    ctx = spec.context(str(tmp_path), {"languages": "de", "split": "ratio"}, str(tmp_path / "state"))
    with TestPipeline(runner=DirectRunner()) as p:
        out = p | ReadNewsJsonl(ctx)
        ids = out["documents"] | beam.Map(
            lambda d: (d.doc_id, tuple(d.sentences), isinstance(d, RawDocument))
        )
        reasons = out[DEAD_LETTER] | beam.Map(lambda d: d.reason)
        want = [
            ("a1#0", ("Rot in der Stadt", "Die Polizei sagte ...", "Ein roter Kreis"), True),
            ("a1#1", ("Rot in der Stadt", "Die Polizei sagte ..."), True),
        ]
        assert_that(ids, equal_to(want), label="docs")
        assert_that(reasons, equal_to(["language_filtered", "malformed_record", "not_utf8"]), label="dead")
        lines_dead = (
            out[DEAD_LETTER] | beam.Filter(lambda d: d.kind == "line") | beam.Map(lambda d: d.source_id)
        )
        path = str(tmp_path / "export.jsonl")
        assert_that(lines_dead, equal_to([f"{path}:3", f"{path}:4"]), label="where")  # file and line
    assert NEWS_SOURCES == ("headline", "lead", "body", "caption")


def test_goodnews_members_become_news_samples():
    from pathlib import Path

    from pipelines.sources.goodnews import ReadGoodNews
    from pipelines.sources.jsonstream import stream_members

    root = Path(__file__).parents[1] / "fixtures" / "goodnews"
    assert list(stream_members(['{"a": 1, "b": {"c": [2]}}'])) == [("a", 1), ("b", {"c": [2]})]
    spec = get_spec("goodnews")
    ctx = spec.context(str(root), {}, str(root / "state"))
    with TestPipeline(runner=DirectRunner()) as p:
        out = p | ReadGoodNews(ctx)
        docs = out["documents"] | beam.Map(
            lambda d: (d.doc_id, tuple(d.metadata[k] for k in ("news_sources", "date")))
        )
        uris = out["documents"] | beam.Map(lambda d: d.image_uris[0].rsplit("/", 2)[-2:])
        reasons = out[DEAD_LETTER] | beam.Map(lambda d: d.reason)
        a, b = "5a4a7e8a95d0e0246f213b67", "5a4a7e8a95d0e0246f213b68"
        want = [
            (f"{a}#0", ("headline,lead,body,caption", "2018-01-02")),
            (f"{a}#1", ("headline,lead,body,caption", "2018-01-02")),
            (f"{b}#0", ("headline,body", "2018-01-04")),  # an empty caption: the source is absent
        ]
        assert_that(docs, equal_to(want), label="docs")
        assert_that(
            uris,
            equal_to([["resized", f"{a}_0.jpg"], ["resized", f"{a}_1.jpg"], ["resized", f"{b}_0.jpg"]]),
            label="uris",
        )
        assert_that(reasons, equal_to(["malformed_record"]), label="dead")
    with pytest.raises(MmlinksError, match="val_from"):
        spec.check(spec.context(str(root), {"split": "date"}, "s"))


def test_escaped_lone_surrogates_are_repaired_and_bad_bytes_dead_lettered(tmp_path):
    """Found by tests/faults/test_stream_fuzz.py: a lone surrogate escaped in the JSON
    (``"\\ud83d"``) reached Beam's coder (a UnicodeEncodeError that failed the whole build) from
    the news and NYTimes800k lines and GoodNews's file, and GoodNews kept bytes that are not UTF-8
    as surrogates too; now the text is repaired (counted) and such bytes are a ``not_utf8`` letter."""
    from pipelines.sources.goodnews import ParseGoodNews

    line = (
        '{"article_id": "a\\udc80", "language": "en", "date": "2015-01-02", "headline": "x \\ud83d",'
        ' "images": [{"uri": "a.jpg", "caption": "c"}], "split": "train", "_id": "a", "image_positions": []}'
    )
    (doc,) = parse_article(line, "/data", SplitRule("ratio"))  # (NYTimes800k: the same repair)
    assert isinstance(doc, RawDocument) and doc.doc_id == "a\ufffd#0"
    for text in (*doc.sentences, *doc.metadata.values()):
        text.encode("utf-8")  # no lone surrogate left
    article = b'{"k": {"article": "TEXT", "headline": {"main": "h"}, "images": {"0": "cap"}}}'
    path = tmp_path / "captioning_dataset.json"
    path.write_bytes(article.replace(b"TEXT", b"x \\ud83d"))
    (doc,) = ParseGoodNews(str(tmp_path), "resized", SplitRule("ratio")).process(str(path))
    assert any("\ufffd" in s for s in doc.sentences) and all(s.encode() for s in doc.sentences)
    path.write_bytes(article.replace(b"TEXT", b"x \xff"))
    (out,) = ParseGoodNews(str(tmp_path), "resized", SplitRule("ratio")).process(str(path))
    assert out.tag == DEAD_LETTER and (out.value.source_id, out.value.reason) == ("k", "not_utf8")


def test_synth_news_command(tmp_path, capfd):
    from cli.main import main

    assert (
        main(
            ["data", "synth-news", "--out", str(tmp_path), "--articles", "3", "--image-size", "32", "--json"]
        )
        == 0
    )
    out = json.loads(capfd.readouterr().out)
    assert out["documents"] == 3 and (tmp_path / "corpus.json").exists()
    lines = (tmp_path / "articles.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(
        (tmp_path / im["uri"]).exists() for ln in lines for im in json.loads(ln)["images"]
    )


def test_wit_bad_bytes_and_a_broken_gzip_stream_are_dead_letters(tmp_path, monkeypatch):
    """Found by tests/faults/test_table_fuzz.py: a byte that is not UTF-8 (UnicodeDecodeError),
    a cut gzip stream (EOFError) and a file that is not gzip (BadGzipFile) crashed the step."""
    import csv
    import gzip
    import io

    from pipelines.sources import csvtable, wit
    from tests.fixtures.wit import ROWS

    def reasons(name: str, data: bytes) -> list[tuple[str, str]]:
        (tmp_path / name).write_bytes(data)
        step = wit.ParseWitFile(None, frozenset({"image/jpeg"}))
        out = step.process(str(tmp_path / name))
        return [(o.value.source_id, o.value.reason) for o in out if hasattr(o, "tag")]

    buf = io.StringIO()
    csv.writer(buf, delimiter="\t", lineterminator="\n").writerow(ROWS[3])
    good = buf.getvalue().encode()
    bad = good.replace(b"Chillon", b"Chil\xfflon", 1)
    assert reasons("a.tsv", b"\xef\xbb\xbf" + good + bad + good) == [("a.tsv:1", "not_utf8")]  # BOM dropped
    packed = gzip.compress(good * 3)
    assert reasons("b.tsv.gz", packed[:-6])[-1] == ("b.tsv.gz:3", "malformed_file")
    assert reasons("c.tsv.gz", b"not gzip") == [("c.tsv.gz:0", "malformed_file")]
    monkeypatch.setattr(csvtable, "FIELD_LIMIT", 100)  # a field over the limit ends the file
    limit = csv.field_size_limit()  # process-wide: rows_of sets it, restored for later tests
    try:
        assert reasons("d.tsv", good + b"x" * 200 + b"\n") == [("d.tsv:1", "malformed_file")]
    finally:
        csv.field_size_limit(limit)


def test_wit_rows_become_news_samples_grouped_by_page(tmp_path):
    from pipelines.sources.wit import ReadWit, page_key, rows_of
    from tests.fixtures.wit import DE_PAGE, ROWS, write_wit

    path = write_wit(tmp_path / "wit")
    rows = list(rows_of(str(path)))
    assert rows[1] == ROWS[0] and "\t" in rows[1][-1] and "\n" in rows[1][-1]  # quoting survives
    spec = get_spec("wit")
    ctx = spec.context(str(tmp_path / "wit"), {"languages": "de,fr"}, str(tmp_path / "state"))
    de = page_key({"language": "de", "page_url": DE_PAGE})
    with TestPipeline(runner=DirectRunner()) as p:
        out = p | ReadWit(ctx)
        docs = out["documents"] | beam.Map(
            lambda d: (
                d.doc_id,
                d.metadata["news_sources"],
                d.metadata["language"],
                d.image_uris[0].rsplit("/", 1)[-1],
                d.split,
            )
        )
        texts = out["documents"] | beam.Map(lambda d: (d.doc_id, d.sentences[0], d.sentences[-1]))
        reasons = out[DEAD_LETTER] | beam.Map(lambda d: d.reason)
        split = assign_split(de, {"train": 0.8, "val": 0.1, "test": 0.1})
        fr = page_key({"language": "fr", "page_url": ROWS[3][1]})
        fr_split = assign_split(fr, {"train": 0.8, "val": 0.1, "test": 0.1})
        want = [
            (f"{de}#0", "headline,lead,body,caption", "de", "Lac_Leman.jpg", split),
            (f"{de}#1", "headline,lead,body", "de", "Jet_d_eau.jpg", split),  # listed twice: kept once
            (f"{fr}#0", "headline,lead,caption", "fr", "Chillon.jpg", fr_split),
        ]
        assert_that(docs, equal_to(want), label="docs")
        assert_that(
            texts | beam.Filter(lambda t: t[0] == f"{de}#0"),
            equal_to([(f"{de}#0", "Genfersee", "Der Genfersee von Lausanne aus")]),
            label="texts",
        )
        assert_that(
            reasons, equal_to(["language_filtered", "malformed_record", "unsupported_mime"]), label="dead"
        )
    with pytest.raises(MmlinksError, match="no date"):
        spec.check(spec.context(str(tmp_path / "wit"), {"split": "date"}, "s"))
    with pytest.raises(MmlinksError, match=r"no \.tsv"):
        spec.check(spec.context(str(tmp_path), {}, "s"))


@pytest.mark.slow  # a whole build (image store, features, shards, commit)
def test_the_goodnews_fixture_builds_into_a_dataset(tmp_path):
    from pathlib import Path

    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig

    root = Path(__file__).parents[1] / "fixtures" / "goodnews"
    manifest = build_dataset(BuildConfig(source="goodnews", input=str(root), out=str(tmp_path / "ds")))
    assert manifest.source == "goodnews"
    assert sum(manifest.counts["splits"].values()) == 3  # one sample per image, none dropped as blank
    assert manifest.counts["dropped"] == {"document:malformed_record": 1}, manifest.counts["dropped"]
