"""The ``wiki`` source: markup stripping and sentence splitting, the ImageCLEF collection reader,
and the MediaWiki API crawler against a loopback fixture server."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.direct_runner import DirectRunner
from pipelines.records import COUNTS_NAMESPACE, DROPPED_NAMESPACE, DeadLetter, RawDocument
from pipelines.sources import get_spec, source_outputs
from pipelines.sources.wiki.common import HARD_MAX_SENTENCES
from pipelines.sources.wiki.imageclef import BuildImageClefDocument, parse_image_metadata, unwrap_article
from pipelines.sources.wiki.mediawiki import (
    ArticleFailed,
    MediaWikiArticles,
    file_names_in_html,
    parse_titles_line,
)
from pipelines.text_segmentation import html_to_text, split_sentences, strip_wiki_markup
from schemas.errors import MmlinksError
from tests.fixtures.wiki import (
    MediaWikiServer,
    article_sentences,
    mediawiki_site,
    parse_html,
    write_imageclef,
)

SPEC = get_spec("wiki")

# --------------------------------------------------------------------------- text: wikitext

REALISTIC = """{{Use dmy dates|date=May 2009}}
{{Infobox river
| name = Seine
| image = Paris Seine.jpg
| length = {{convert|777|km|mi|abbr=on}}
| source = {{coord|47|29|N|4|43|E|{{small|display}}=inline}}
}}
'''Seine''' ({{IPA-fr|sɛn|lang}}) is a {{convert|777|km}} long [[river]] in northern \
[[France]].<ref name="len">{{cite web|url=http://x.example|title=Hidden cite}}</ref> \
Its [[drainage basin|basin]] covers most of the region.<ref name="len" /> \
The river is {{lang|fr|la Seine}} in French.
<!-- an editor's hidden note -->
[[File:Seine Paris.jpg|thumb|right|The Seine near the [[Louvre|Louvre museum]] in 2008]]
[[Image:Old map.png|left|Hidden [[old map]] caption]]
== Course ==
The source is near [[Dijon]] at {{convert|471|m}} altitude.<ref>Hidden plain ref.</ref>
Its flow satisfies <math>Q = \\frac{1}{2}</math> on average.
{| class="wikitable"
|-
! Hidden header !! Other
|-
| Hidden cell || [[Hidden link]]
|}
The main tributaries are:
* the [[Aube (river)|Aube]]
* the [[Marne]], joining at [[Charenton]]
=== Ports ===
Paris has river ports.&nbsp;They handle cargo &amp; passengers.
== See also ==
* [[List of rivers of France]]
== References ==
{{Reflist}}
[[Category:Rivers of France]]
[[de:Seine]]
[[zh-yue:塞納河]]
"""


def test_strip_wiki_markup_realistic_article():
    text = strip_wiki_markup(REALISTIC)
    assert text.split("\n") == [
        "Seine is a 777 km long river in northern France. Its basin covers most of the region. "
        "The river is la Seine in French.",
        "",
        "The source is near Dijon at 471 m altitude.",
        "Its flow satisfies on average.",
        "",  # the table
        "The main tributaries are:",
        "the Aube",
        "the Marne, joining at Charenton",
        "",
        "Paris has river ports. They handle cargo & passengers.",
    ]
    for hidden in ("Hidden", "Infobox", "Category", "Reflist", "List of rivers", "thumb", "Q =", "zh-yue"):
        assert hidden not in text


def test_strip_wiki_markup_keeps_visible_links_and_drops_namespaces():
    assert strip_wiki_markup("See [[:Category:Rivers|the rivers]] and [[wikt:river]].") == (
        "See the rivers and wikt:river."
    )
    assert strip_wiki_markup("A [http://x.example label] and [http://y.example] http://z.example end.") == (
        "A label and end."
    )
    assert strip_wiki_markup("Text<ref name=a/>.<ref group=n>Note</ref> __NOTOC__ more") == "Text. more"


def test_only_known_language_prefixes_make_interlanguage_links():
    assert strip_wiki_markup("Watch [[CSI: Miami|CSI]] tonight.") == "Watch CSI tonight."
    assert strip_wiki_markup("Watch [[CSI: Miami]] and [[Sri: Lanka]].") == "Watch CSI: Miami and Sri: Lanka."
    assert strip_wiki_markup("Berlin is a city.[[de:Berlin]][[zh-yue:柏林]][[simple:Berlin]]") == (
        "Berlin is a city."
    )
    # a space after the colon, or a pipe, makes an ordinary link even with a language prefix
    assert strip_wiki_markup("[[It: Chapter Two]] and [[fr:Paris|Paris]].") == "It: Chapter Two and Paris."


def test_split_sentences_basic():
    text = "Dr. Smith lived in the U.S.A. for years. He left in 1999.\nA line without a stop\n\n  \n!!!"
    assert split_sentences(text) == [
        "Dr. Smith lived in the U.S.A. for years.",
        "He left in 1999.",
        "A line without a stop",
    ]
    assert split_sentences(text, max_sentences=2) == [
        "Dr. Smith lived in the U.S.A. for years.",
        "He left in 1999.",
    ]


# Property tests: markup built from pieces whose words are either visible or hidden.
VISIBLE = [f"vis{k}" for k in range(30)]
HIDDEN = [f"hid{k}" for k in range(30)]


@st.composite
def wikitext_pieces(draw, depth=0):
    """(wikitext, visible words in order): nested templates/links/refs/tables/files..."""
    vis = st.sampled_from(VISIBLE)
    hid = st.sampled_from(HIDDEN)
    kind = draw(
        st.sampled_from(
            ["word", "word", "link", "piped", "bold", "template", "ref", "file"]
            + ["category", "comment", "table", "math"]
            + (["nested"] if depth < 2 else [])
        )
    )
    if kind == "word":
        w = draw(vis)
        return w, [w]
    if kind == "link":
        w = draw(vis)
        return f"[[{w}]]", [w]
    if kind == "piped":
        w = draw(vis)
        return f"[[{draw(hid)} page|{w}]]", [w]
    if kind == "bold":
        w = draw(vis)
        return f"'''{w}'''", [w]
    if kind == "template":
        inner, _ = draw(wikitext_pieces(depth=depth + 1)) if depth < 2 else (draw(hid), [])
        return f"{{{{Infobox {draw(hid)}|x={inner}|y={{{{{draw(hid)}}}}}}}}}", []
    if kind == "ref":
        return f'<ref name="{draw(hid)}">{draw(hid)} {{{{cite|{draw(hid)}}}}}</ref>', []
    if kind == "file":
        return f"[[File:{draw(hid)}.jpg|thumb|A [[{draw(hid)}]] caption {draw(hid)}]]", []
    if kind == "category":
        return f"[[Category:{draw(hid)}]]", []
    if kind == "comment":
        return f"<!-- {draw(hid)} -->", []
    if kind == "table":
        return f'\n{{| class="wikitable"\n|-\n| {draw(hid)} || [[{draw(hid)}]]\n|}}\n', []
    if kind == "math":
        return f"<math>{draw(hid)}^2</math>", []
    parts = draw(st.lists(wikitext_pieces(depth=depth + 1), min_size=1, max_size=3))
    return " ".join(p for p, _ in parts), [w for _, ws in parts for w in ws]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(wikitext_pieces(), min_size=1, max_size=12))
def test_strip_keeps_visible_words_in_order_and_drops_hidden(pieces):
    source = " ".join(p for p, _ in pieces)
    visible = [w for _, ws in pieces for w in ws]
    out = strip_wiki_markup(source)
    assert re.findall(r"vis\d+", out) == visible
    assert not re.findall(r"hid\d+", out)
    assert "[[" not in out and "{{" not in out and "<ref" not in out.lower()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("[]{}|<>/=!-'ref \nabcXYZ.:#&;")), max_size=80))
def test_strip_never_leaves_markup_debris(text):
    out = strip_wiki_markup(text)
    assert "[[" not in out and "{{" not in out and "<ref" not in out.lower()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_split_sentences_keeps_all_alphanumerics_in_order(text):
    sentences = split_sentences(text)
    alnum = "".join(ch for ch in text if ch.isalnum())
    assert "".join(ch for s in sentences for ch in s if ch.isalnum()) == alnum
    assert all(s == s.strip() and s and "\n" not in s for s in sentences)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=6))
def test_split_sentences_matches_constructed_sentences(lengths):
    # Paragraphs of known plain sentences come back exactly, in order.
    expected, lines = [], []
    for p, n in enumerate(lengths):
        sents = article_sentences(f"Place {p}", n, salt=p)
        expected += sents
        lines.append(" ".join(sents))
    assert split_sentences("\n".join(lines)) == expected


# --------------------------------------------------------------------------- text: HTML


def test_html_to_text_keeps_paragraphs_only():
    paragraphs = ["First paragraph with a <a href='/wiki/X'>link</a> in it.", "Second one <b>bold</b>."]
    html = parse_html("T", paragraphs, ["A.jpg", "B.jpg"])
    assert html_to_text(html) == "First paragraph with a link in it.\nSecond one bold."
    html2 = (
        '<div class="mw-parser-output"><p>Kept <span class="mw-editsection">[edit]</span>text'
        '<sup class="reference">[1]</sup>.</p><table><tr><td><p>Hidden</p></td></tr></table>'
        "<figure><figcaption><p>Hidden caption</p></figcaption></figure><ul><li>Hidden list</li></ul>"
        '<p><span class="mwe-math-element">x^2</span> Math dropped.</p></div>'
    )
    assert html_to_text(html2) == "Kept text.\nMath dropped."


# --------------------------------------------------------------------------- ImageCLEF


def run_source(ctx, out_dir: Path, *, options: PipelineOptions | None = None):
    """(documents, dead letters, counters) of one DirectRunner run of the wiki source."""
    out_dir.mkdir(parents=True, exist_ok=True)
    p = beam.Pipeline(runner=DirectRunner(), options=options)
    d, dl = source_outputs(p | SPEC.make(ctx))
    for name, pcoll in (("docs", d), ("dead", dl)):
        _ = (
            pcoll
            | f"{name}Json" >> beam.Map(lambda x: json.dumps(dataclasses.asdict(x)))
            | f"{name}Write" >> beam.io.WriteToText(str(out_dir / name), shard_name_template="")
        )
    result = p.run()
    result.wait_until_finish()
    counters: dict[str, int] = {}
    for ns in (COUNTS_NAMESPACE, DROPPED_NAMESPACE):
        for c in result.metrics().query(MetricsFilter().with_namespace(ns))["counters"]:
            counters[c.key.metric.name] = counters.get(c.key.metric.name, 0) + c.committed

    def load(name, cls):
        text = (out_dir / name).read_text()
        return [cls(**json.loads(line)) for line in text.splitlines() if line]

    return load("docs", RawDocument), load("dead", DeadLetter), counters


@pytest.fixture(scope="module")
def imageclef(tmp_path_factory):
    root = tmp_path_factory.mktemp("imageclef")
    fx = write_imageclef(root)
    ctx = SPEC.context(str(root), {}, str(root / "state"))
    SPEC.check(ctx)
    return fx, run_source(ctx, root / "out")


def test_imageclef_documents_match_the_collection(imageclef):
    fx, (docs, _, _) = imageclef
    by_id = {d.doc_id: d for d in docs}
    assert sorted(by_id) == sorted(fx.documents)
    for doc_id, exp in fx.documents.items():
        doc = by_id[doc_id]
        assert doc.source == "wiki"
        assert doc.links is None and doc.split is None
        assert doc.sentences == exp.sentences
        assert doc.image_uris == [str(fx.root / f) for f in exp.image_files]
        assert doc.metadata["title"] == exp.title
        assert doc.metadata["article"] == exp.article
        assert doc.metadata["lang"] == "en"
        assert doc.metadata["image_ids"] == ",".join(exp.image_ids)


def test_imageclef_shared_image_is_in_both_articles(imageclef):
    fx, (docs, _, _) = imageclef
    holders = [d.doc_id for d in docs if fx.shared_image_id in d.metadata["image_ids"].split(",")]
    assert sorted(holders) == ["wiki-5000", "wiki-5001"]


def test_imageclef_dead_letters_and_counters(imageclef):
    fx, (_, dead, counters) = imageclef
    got = sorted((d.kind, d.reason, d.source_id) for d in dead)
    assert got == sorted(
        [
            ("line", "malformed_xml", fx.malformed_files[0]),
            ("document", "missing_article", fx.missing_article_doc),
        ]
    )
    assert counters["images_without_article"] == fx.images_without_article
    assert counters["article_not_utf8"] == 1
    assert counters["line:malformed_xml"] == 1
    assert counters["document:missing_article"] == 1
    assert counters["documents_in"] == len(fx.documents)


def test_imageclef_lang_option_groups_other_language_articles(tmp_path):
    write_imageclef(tmp_path, n_articles=2, sentences_per_article=3, images_per_article=2)
    ctx = SPEC.context(str(tmp_path), {"lang": "de"}, str(tmp_path / "state"))
    docs, dead, counters = run_source(ctx, tmp_path / "out")
    # The German articles are not in the fixture: every German caption's article is missing.
    assert docs == []
    assert sorted(d.source_id for d in dead if d.reason == "missing_article") == [
        "wiki-de-55",
        "wiki-de-77",
        "wiki-de-9",
    ]
    # Without a German caption: the image whose English caption has no article, and the three
    # images of the missing English article (the German-only image now has its article).
    assert counters["images_without_article"] == 4


def test_parse_image_metadata_shapes():
    xml = b"""<?xml version="1.0"?>
    <image id="42" file="images/7/42.png"><name>Foo.png</name>
      <text xml:lang="en"><description>d</description><comment/>
        <caption article="text/en/3/1">First <b>caption</b></caption>
        <caption article="/text/en/4/2/">Second</caption></text>
      <text lang="FR"><caption article="text/fr/1/9">Fr</caption></text>
      <text xml:lang="de"><caption>No article</caption></text>
      <comment>general</comment><license>GFDL</license></image>"""
    meta = parse_image_metadata(xml, "/c/all_text/metadata/7/42.xml", ["en", "fr"])
    assert (meta.image_id, meta.file, meta.name) == ("42", "images/7/42.png", "Foo.png")
    assert meta.captions == [
        ("en", "text/en/3/1", "First caption"),
        ("en", "text/en/4/2", "Second"),
        ("fr", "text/fr/1/9", "Fr"),
    ]
    # No id/file attributes: the file name and folder give them.
    meta = parse_image_metadata(b"<image><text xml:lang='en'/></image>", "/c/metadata/3/77.xml", ["en"])
    assert (meta.image_id, meta.file, meta.captions) == ("77", "images/3/77.jpg", [])
    with pytest.raises(ValueError):
        parse_image_metadata(b"<article/>", "/c/metadata/3/77.xml", ["en"])


def test_unwrap_article_accepts_raw_and_xml_wrapped_wikitext():
    assert unwrap_article("'''Foo''' is [[bar]].") == ("", "'''Foo''' is [[bar]].")
    assert unwrap_article("<div>Boxed</div> text") == ("", "<div>Boxed</div> text")
    assert unwrap_article("<!-- c --> text") == ("", "<!-- c --> text")
    wrapped = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<article><name id="5">Foo</name><body>A &amp; [[b]]</body></article>'
    )
    assert unwrap_article(wrapped) == ("Foo", "A & [[b]]")
    export = (
        "<page><title>Bar</title><id>3</id>"
        "<revision><text xml:space='preserve'>Body {{x}}</text></revision></page>"
    )
    assert unwrap_article(export) == ("Bar", "Body {{x}}")
    assert unwrap_article("<article><title>T</title>Loose text</article>") == ("T", "Loose text")
    with pytest.raises(ValueError):
        unwrap_article("<article><title>T</title><text>unclosed")


def test_article_hard_cap_of_sentences(tmp_path):
    article = tmp_path / "text" / "en" / "1" / "9"
    article.parent.mkdir(parents=True)
    article.write_text(" ".join(f"Sentence number {k} is here." for k in range(1100)))
    fn = BuildImageClefDocument((str(tmp_path),))
    (doc,) = list(fn.process((("en", "text/en/1/9"), [{"id": "2", "uri": "b"}, {"id": "10", "uri": "a"}])))
    assert len(doc.sentences) == HARD_MAX_SENTENCES
    assert doc.sentences[0] == "Sentence number 0 is here."
    assert doc.image_uris == ["b", "a"]  # numeric id order: 2 before 10


def test_check_rejects_bad_inputs(tmp_path):
    with pytest.raises(MmlinksError, match="not an ImageCLEF"):
        SPEC.check(SPEC.context(str(tmp_path), {}, str(tmp_path / "s")))
    with pytest.raises(MmlinksError, match="mode"):
        SPEC.check(SPEC.context(str(tmp_path), {"mode": "dump"}, str(tmp_path / "s")))
    with pytest.raises(MmlinksError, match="titles file"):
        SPEC.check(SPEC.context(str(tmp_path / "none.txt"), {"mode": "mediawiki"}, str(tmp_path / "s")))
    with pytest.raises(MmlinksError, match="api_base"):
        bad = {"mode": "mediawiki", "api_base": "ftp://x"}
        SPEC.check(SPEC.context(str(tmp_path), bad, str(tmp_path / "s")))
    with pytest.raises(MmlinksError, match="no option"):
        SPEC.context(str(tmp_path), {"colour": "red"}, str(tmp_path / "s"))


def test_spec_defaults_follow_the_paper():
    assert SPEC.build_defaults["filter_preset"] == "wiki"
    assert SPEC.build_defaults["dedupe_threshold"] == "off"
    ratios = SPEC.build_defaults["split_ratios"]
    assert ratios["train"] / ratios["val"] == 14 and ratios["val"] == ratios["test"]
    assert {o.name: o.default for o in SPEC.options}["concurrency"] == "1"
    assert SPEC.fetcher(SPEC.context("/x", {}, "/s")) is None


# --------------------------------------------------------------------------- MediaWiki

TITLES = """# articles to crawl
Fixture city
Fixture_city   # the same article again
Fixture town
Fixture river

Missing page
Flaky page
Throttled page
Down page
"""


def mediawiki_ctx(tmp_path: Path, server: MediaWikiServer, **extra: str):
    titles = tmp_path / "titles.txt"
    titles.write_text(TITLES)
    options = {
        "mode": "mediawiki",
        "api_base": server.base,
        "image_host": server.host,
        "allow_private": "true",
        "polite": "false",
        "retries": "2",
        **extra,
    }
    ctx = SPEC.context(str(titles), options, str(tmp_path / "state"))
    SPEC.check(ctx)
    return ctx


def make_server(**kw) -> MediaWikiServer:
    pages, files, redirects = mediawiki_site()
    return MediaWikiServer(
        pages,
        files,
        redirects,
        fail_first={"Flaky page": [503], "Throttled page": [429]},
        always_fail={"Down page"},
        **kw,
    )


def test_mediawiki_documents_dead_letters_and_state(tmp_path):
    with make_server() as server:
        ctx = mediawiki_ctx(tmp_path, server)
        docs, dead, counters = run_source(ctx, tmp_path / "run1")
        by_id = {d.doc_id: d for d in docs}
        assert sorted(by_id) == ["wiki-101", "wiki-102", "wiki-103", "wiki-104"]
        city = by_id["wiki-101"]
        assert city.sentences == article_sentences("Fixture city", 12, 1)
        assert city.links is None and city.source == "wiki"
        # HTML order (not the API's alphabetical list); SVG, GIF and the 20x20 icon skipped.
        assert city.image_uris == [
            server.image_url("Old harbour.jpg"),
            server.image_url("Town hall, 1900.jpg"),
            server.image_url("Night view.png"),
        ]
        assert city.metadata["title"] == "Fixture city" and city.metadata["pageid"] == "101"
        # Per fetch: the city page was fetched twice (once through the "Fixture town" redirect).
        assert counters["images_skipped_mime"] == 4 and counters["images_skipped_small"] == 2
        assert counters["redirect_duplicates"] == 1  # "Fixture town" redirects to the city
        assert len(by_id["wiki-103"].image_uris) == 3 and len(by_id["wiki-104"].sentences) == 12
        assert sorted((d.reason, d.source_id) for d in dead) == [
            ("fetch_failed", "Down page"),
            ("missing_title", "Missing page"),
        ]
        # The 503 and the 429 were retried once each.
        assert server.hits["parse", "Flaky page"] == 2
        assert server.hits["parse", "Throttled page"] == 2
        assert server.hits["parse", "Fixture city"] == 1  # "Fixture_city" deduplicated
        first_hits = dict(server.hits)
        down_hits = server.hits["parse", "Down page"]
        assert down_hits == 3  # 1 + retries=2

        # A rerun with the same crawl state fetches only the transient failure again.
        docs2, dead2, counters2 = run_source(ctx, tmp_path / "run2")
        assert sorted((d.doc_id, d.sentences, d.image_uris) for d in docs2) == sorted(
            (d.doc_id, d.sentences, d.image_uris) for d in docs
        )
        assert sorted((d.reason, d.source_id) for d in dead2) == sorted((d.reason, d.source_id) for d in dead)
        changed = {k for k in server.hits if server.hits[k] != first_hits.get(k, 0)}
        assert changed == {("parse", "Down page")}
        assert counters2["articles_from_state"] == 6


def test_mediawiki_requests_never_overlap_when_polite(tmp_path):
    with make_server(delay=0.02) as server:
        ctx = mediawiki_ctx(tmp_path, server, polite="true", rate="1000", backoff_max="2")
        options = PipelineOptions(direct_num_workers=4, direct_running_mode="multi_threading")
        docs, _, _ = run_source(ctx, tmp_path / "out", options=options)
        assert len(docs) == 4
        assert server.max_in_flight == 1
        # Politeness also means waiting out the 429's Retry-After: 1.
        first, second = server.parse_times["Throttled page"]
        assert second - first >= 0.95


def test_mediawiki_fetcher_gets_images_from_the_image_host_only(tmp_path):
    from pipelines.image_fetch import FetchFailed

    with make_server() as server:
        ctx = mediawiki_ctx(tmp_path, server)
        _, files, _ = mediawiki_site()
        url = server.image_url("Old harbour.jpg")
        assert SPEC.fetcher(ctx).fetch(url, 10_000_000).data == files["Old harbour.jpg"].body
        other = SPEC.context(ctx.input, {**ctx.options, "image_host": "upload.example"}, ctx.state_dir)
        with pytest.raises(FetchFailed, match="refused_host"):
            SPEC.fetcher(other).fetch(url, 10_000_000)
        assert server.hits["image", "Old harbour.jpg"] == 1


def test_parse_titles_and_file_names():
    assert parse_titles_line(b"  fixture_city  # comment") == "Fixture city"
    assert parse_titles_line(b"# only a comment") is None
    assert parse_titles_line("\ufeffCaf\u00e9".encode()) == "Café"
    html = (
        '<a href="/wiki/File:B_b.jpg"><img></a><a href="/wiki/Other">x</a>'
        '<a href="./File:A%20a.png">y</a><a href="/wiki/File:B_b.jpg">again</a>'
    )
    assert file_names_in_html(html) == ["B b.jpg", "A a.png"]


def test_mediawiki_api_error_shapes():
    fn = MediaWikiArticles(client=None, api_base="http://w", image_host="u", state_root="/tmp/unused")

    class Resp:
        def __init__(self, status, body):
            self.status, self.body, self.url = status, body, "http://w/w/api.php"

        def json(self):
            return json.loads(self.body)

    class Client:
        def __init__(self, resp):
            self.resp = resp

        def get(self, url, params=None, use_cache=True):
            return self.resp

    for body, reason, permanent in [
        ('{"error": {"code": "missingtitle", "info": "gone"}}', "missing_title", True),
        ('{"error": {"code": "invalidtitle", "info": "bad"}}', "invalid_title", True),
        ('{"error": {"code": "maxlag", "info": "lagged"}}', "api_error", False),
        ("<html>not json</html>", "bad_response", False),
    ]:
        fn.client = Client(Resp(200, body.encode()))
        with pytest.raises(ArticleFailed) as info:
            fn.fetch("X")
        assert (info.value.reason, info.value.permanent) == (reason, permanent)
    fn.client = Client(Resp(500, b""))
    with pytest.raises(ArticleFailed, match="fetch_failed"):
        fn.fetch("X")


@pytest.mark.parametrize(
    "bodies, where",
    [
        (['{"parse": {"images": 5, "text": ""}}'], "parse.images"),
        (['{"parse": {"text": 7}}'], "parse.text"),
        (['{"parse": {"text": "", "images": [["A.jpg"]]}}'], "parse.images"),
        (['{"parse": {"text": "", "images": ["A.jpg"]}}', '{"query": [1]}'], "query"),
        (['{"parse": {"text": "", "images": ["A.jpg"]}}', '{"query": {"pages": [7]}}'], "query.pages"),
        (
            [
                '{"parse": {"text": "", "images": ["A.jpg"]}}',
                '{"query": {"pages": [{"title": "File:A.jpg", "imageinfo": [{"url": "http://u/a",'
                ' "mime": "image/jpeg", "width": "wide", "height": 500}]}]}}',
            ],
            "imageinfo.width",
        ),
    ],
)
def test_mediawiki_malformed_api_shapes_are_dead_letters(tmp_path, bodies, where):
    """JSON that is not in the API's shape is the article's ``bad_response`` dead letter naming
    the field, never an exception out of the Beam step (each of these once raised one)."""
    fn = MediaWikiArticles(client=None, api_base="http://w", image_host="u", state_root=str(tmp_path))
    fn.setup()

    class Resp:
        status, url = 200, "http://w/w/api.php"

        def __init__(self, body):
            self.body = body

        def json(self):
            return json.loads(self.body)

    class Client:
        def __init__(self):
            self.answers = list(bodies)

        def get(self, url, params=None, use_cache=True):
            return Resp(self.answers.pop(0))

    fn.client = Client()
    (out,) = list(fn.process("X"))
    assert isinstance(out.value, DeadLetter) and out.value.reason == "bad_response"
    assert out.value.detail.startswith(where), out.value.detail
