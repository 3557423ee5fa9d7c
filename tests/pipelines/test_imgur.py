"""imgur albums and the ``diy`` source: URLs, the three parsers, the scraper, the Beam transform."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.crawl_state import CrawlState
from pipelines.direct_runner import DirectRunner
from pipelines.records import DEAD_LETTER, DeadLetter, RawDocument
from pipelines.sources import get_spec
from pipelines.sources.http_options import policy_from_context
from pipelines.sources.imgur import (
    Album,
    AlbumFailed,
    AlbumImage,
    AlbumParseError,
    AlbumScraper,
    album_id_from_url,
    decode_js_string,
    parse_album_api_v3,
    parse_album_hit_json,
    parse_album_html_2018,
    parse_album_html_json,
    parse_album_url,
)
from pipelines.web import HttpError, HttpResponse, PoliteClient
from schemas.errors import MmlinksError
from schemas.text import repair_surrogates
from tests.fixtures.imgur import (
    FixtureAlbum,
    FixtureImage,
    ImgurFixtureServer,
    album_page_2018,
    album_page_json,
    api_v3_body,
    candidate_posts,
    diy_albums,
    hit_json_body,
    js_string_literal,
)

# ------------------------------------------------------------------------------------ URLs

ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://imgur.com/a/TcBmP", ("a", "TcBmP")),
        ("https://imgur.com/a/iX265HX", ("a", "iX265HX")),
        ("https://m.imgur.com/a/iX265HX", ("a", "iX265HX")),
        ("http://www.imgur.com/a/TcBmP#0", ("a", "TcBmP")),
        ("https://imgur.com/a/TcBmP?", ("a", "TcBmP")),
        ("https://imgur.com/a/TcBmP/all", ("a", "TcBmP")),
        ("https://imgur.com/a/TcBmP/layout/blog", ("a", "TcBmP")),
        ("https://imgur.com/a/TcBmP/embed?pub=true", ("a", "TcBmP")),
        ("imgur.com/a/TcBmP", ("a", "TcBmP")),
        ("//imgur.com/a/TcBmP/", ("a", "TcBmP")),
        ("HTTPS://IMGUR.COM/a/TcBmP", ("a", "TcBmP")),
        ("https://imgur.com/gallery/eD9CT", ("gallery", "eD9CT")),
        ("https://imgur.com/t/diy/AbCdE12", ("gallery", "AbCdE12")),
        ("https://imgur.com/a/my-new-walnut-table-AbCdE12", ("a", "AbCdE12")),
        ("https://imgur.com/gallery/how-to-fix-a-sink-2-Zz9y8X7", ("gallery", "Zz9y8X7")),
        ("https://imgur.io/a/iX265HX", ("a", "iX265HX")),
    ],
)
def test_album_url_shapes(url, expected):
    assert parse_album_url(url) == expected
    assert album_id_from_url(url) == expected[1]


@pytest.mark.parametrize(
    "url",
    [
        "https://imgur.com/TcBmPxx",  # a single image page
        "https://i.imgur.com/TcBmPxx.jpg",
        "https://imgur.com/a/",
        "https://imgur.com/a/abc",  # too short
        "https://imgur.com/a/abcdef",  # 6: neither an old nor a new id
        "https://imgur.com/a/abcdefgh",
        "https://imgur.com/a/ab_de",
        "https://notimgur.com/a/TcBmP",
        "https://imgur.com.evil.example/a/TcBmP",
        "https://www.reddit.com/r/DIY/comments/abc/a/",
        "ftp://imgur.com/a/TcBmP",
        "",
        "http://[::1/a/TcBmP",  # unparseable
    ],
)
def test_not_album_urls(url):
    assert album_id_from_url(url) is None


@settings(max_examples=300, deadline=None)
@given(
    album_id=st.one_of(st.text(ID_CHARS, min_size=5, max_size=5), st.text(ID_CHARS, min_size=7, max_size=7)),
    scheme=st.sampled_from(["http://", "https://", "//", ""]),
    host=st.sampled_from(["imgur.com", "www.imgur.com", "m.imgur.com", "IMGUR.com"]),
    kind=st.sampled_from(["a", "gallery", "t/diy"]),
    slug=st.lists(st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8), max_size=4),
    tail=st.sampled_from(["", "/", "#0", "?", "/all", "/layout/blog", "/embed", "?ref=reddit#3", "/zip"]),
)
def test_album_url_roundtrip(album_id, scheme, host, kind, slug, tail):
    token = "-".join([*slug, album_id])
    url = f"{scheme}{host}/{kind}/{token}{tail}"
    assert album_id_from_url(url) == album_id
    assert parse_album_url(url)[0] == ("a" if kind == "a" else "gallery")


# ------------------------------------------------------------------------- JS string literals


def _js_encode(draw, text: str) -> str:
    """Encode ``text`` as a JS string body, each character in a randomly chosen valid way."""
    simple = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f", "\v": "\\v", "\0": "\\0"}
    out = []
    for ch in text:
        code = ord(ch)
        ways = ["u4"] if code <= 0xFFFF else ["pair"]
        ways.append("ubrace")
        if code < 256:
            ways.append("x")
        if ch in simple:
            ways.append("simple")
        if ch not in '"\\\n\r\u2028\u2029':
            ways.append("plain")
        if ch not in "bfnrtvux0123456789\n\r\u2028\u2029":
            ways.append("identity")
        way = draw(st.sampled_from(ways))
        if way == "plain":
            out.append(ch)
        elif way == "identity":
            out.append("\\" + ch)
        elif way == "simple":
            out.append(simple[ch])
        elif way == "x":
            out.append(f"\\x{code:02x}")
        elif way == "u4":
            out.append(f"\\u{code:04X}")
        elif way == "ubrace":
            out.append(f"\\u{{{code:x}}}")
        else:
            hi, lo = divmod(code - 0x10000, 0x400)
            out.append(f"\\u{0xD800 + hi:04x}\\u{0xDC00 + lo:04x}")
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), text=st.text(st.characters(exclude_categories=("Cs",)), max_size=40))
def test_js_string_decoding_roundtrip(data, text):
    assert decode_js_string(_js_encode(data.draw, text)) == text


@given(text=st.text(st.characters(exclude_categories=("Cs",)), max_size=60))
def test_fixture_literal_writer_roundtrips(text):
    literal = js_string_literal(text)
    assert literal[0] == literal[-1] == '"' and "</" not in literal
    assert decode_js_string(literal[1:-1]) == text


@pytest.mark.parametrize("body", ["abc\\", "\\u12", "\\x4", "\\u{110000}", "\\uZZZZ"])
def test_js_string_rejects_malformed_escapes(body):
    with pytest.raises(ValueError):
        decode_js_string(body)


# ------------------------------------------------------------------------------------ parsers


def _norm(text: str | None) -> str | None:
    return " ".join(text.split()) or None if text is not None else None


MIXED = FixtureAlbum(
    "MixdAlb",
    [
        FixtureImage("Img0001", "First, cut the  board\n to length.", "jpg", 1),
        FixtureImage("Img0002", None, "png", 2),
        FixtureImage("Img0003", 'It\'s a "gif" & <b>moves</b>', "gif", 3),
        FixtureImage("Img0004", "   ", "jpg", 4),
        FixtureImage("Img0005", "Café ✓ done 🎉 \\ back\\slash </script>", "jpeg", 5),
    ],
)


def _expected(album: FixtureAlbum) -> list[tuple]:
    return [(im.hash, im.animated, _norm(im.caption)) for im in album.images]


def _got(album: Album) -> list[tuple]:
    return [(im.hash, im.animated, im.caption) for im in album.images]


def test_parse_2018_page():
    album = parse_album_html_2018(album_page_2018(MIXED), album_id="MixdAlb")
    assert album.source == "html-2018" and album.album_id == "MixdAlb"
    assert _got(album) == _expected(MIXED)
    assert [im.ext for im in album.images] == ["jpg", "png", "mp4", "jpg", "jpeg"]
    assert album.images[0].url == "https://i.imgur.com/Img0001.jpg"
    assert album.images[2].caption == 'It\'s a "gif" & <b>moves</b>'  # escaped markup is text
    assert album.declared_count == 5 and album.complete and album.skipped == 0


def test_parse_2018_truncated_page_and_hit_json():
    images = [FixtureImage(f"Big000{k}", f"step {k}", seed=k) for k in range(6)]
    big = FixtureAlbum("BigOne1", images, inline=2)
    page = parse_album_html_2018(album_page_2018(big))
    assert [im.hash for im in page.images] == ["Big0000", "Big0001"]
    assert page.declared_count == 6 and not page.complete
    rest = parse_album_hit_json(hit_json_body(big), album_id="BigOne1", image_base="http://x")
    assert [im.hash for im in rest.images] == [f"Big000{k}" for k in range(6)]
    assert rest.images[3].url == "http://x/Big0003.jpg" and rest.images[3].caption == "step 3"
    assert rest.declared_count == 6
    with pytest.raises(AlbumParseError) as err:
        parse_album_hit_json(hit_json_body(None))
    assert err.value.reason == "album_not_found"
    with pytest.raises(AlbumParseError) as err:
        parse_album_hit_json("{not json")
    assert err.value.reason == "bad_album_json"


def test_parse_2018_truncation_marker_alone_means_incomplete():
    html = album_page_2018(MIXED).replace('"num_images": 5', '"num_images": 1')
    assert parse_album_html_2018(html).complete
    more = '<div class="post-images"><a class="post-loadall">more</a>'
    marked = html.replace('<div class="post-images">', more)
    assert not parse_album_html_2018(marked).complete


def test_parse_2018_quirks():
    html = """<html><body><div class="post-images">
    <div id="Qrk0001" class="post-image-container"><div class="post-image">
      <img src="//i.imgur.com/Qrk0001h.png"></div>
      <div class="post-image-meta"><div class="post-image-description">  line one<br>line\ttwo
         <a href="http://x">link</a>\u00a0end  </div></div></div>
    <div class="post-image-container"><img src="//i.imgur.com/NoId.jpg"></div>
    <div id="Qrk0002" class="post-image-container" data-ext=".GIF?1"></div>
    <div id="Qrk0003" class="post-image-container"><div class="post-image-description"></div></div>
    </div></body></html>"""
    raw = html.encode().replace(b"line one", b"line \xff one")  # a stray non-UTF-8 byte
    album = parse_album_html_2018(raw)
    assert [(im.hash, im.ext, im.animated) for im in album.images] == [
        ("Qrk0001", "png", False),
        ("Qrk0002", "gif", True),
        ("Qrk0003", "jpg", False),  # no markup naming a file: jpg
    ]
    assert album.images[0].caption == "line \ufffd one line two link end"
    assert album.images[2].caption is None
    assert album.skipped == 1


@pytest.mark.parametrize("html", ["<html><body><p>Zoinks</p></body></html>", "", "post-image-container"])
def test_parse_2018_without_markup(html):
    with pytest.raises(AlbumParseError) as err:
        parse_album_html_2018(html)
    assert err.value.reason == "no_album_markup"


def test_parse_current_page():
    album = parse_album_html_json(album_page_json(MIXED), image_base="http://img.test")
    assert album.source == "html-json" and album.album_id == "MixdAlb"
    assert _got(album) == _expected(MIXED)
    assert [im.ext for im in album.images] == ["jpg", "png", "gif", "jpg", "jpeg"]
    assert album.images[4].caption == "Café ✓ done 🎉 \\ back\\slash </script>"
    assert album.images[1].url == "http://img.test/Img0002.png"


def test_parse_current_page_quirks():
    payload = {
        "id": "Qrk",
        "media": [
            {"id": "Cur0001", "ext": "jpeg", "metadata": {"description": 'it\u2019s "quoted"\n\nnext'}},
            {"id": "Cur0002", "mime_type": "image/png"},  # no ext, no metadata
            {"id": "Cur0003", "ext": "mp4", "type": "video", "metadata": {"is_animated": True}},
            {"id": "Cur0004", "url": "https://i.imgur.com/Cur0004.webp", "metadata": {"description": None}},
            {"no_id": True},
            "junk",
        ],
    }
    body = json.dumps(payload).replace("'", "\\'")
    # Single-quoted literal, non-ASCII as \u escapes, a stray byte elsewhere in the page.
    page = (
        b"<html><head><title>\xff</title></head><body><script>window.postDataJSON = '"
        + body.replace("\\", "\\\\").replace("'", "\\'").encode()
        + b"';</script></body></html>"
    )
    album = parse_album_html_json(page)
    assert [(im.hash, im.ext, im.animated, im.caption) for im in album.images] == [
        ("Cur0001", "jpeg", False, 'it\u2019s "quoted" next'),
        ("Cur0002", "png", False, None),
        ("Cur0003", "mp4", True, None),
        ("Cur0004", "webp", False, None),
    ]
    assert album.skipped == 2


@pytest.mark.parametrize(
    "page, reason",
    [
        ("<html><script>window.other={}</script></html>", "no_album_markup"),
        ('<script>window.postDataJSON="{\\"media\\": [}"</script>', "bad_album_json"),
        ('<script>window.postDataJSON="{\\"id\\": \\"x\\"}"</script>', "bad_album_json"),
        ('<script>window.postDataJSON="{\\"media\\": []', "bad_album_json"),  # unterminated
        ('<script>window.postDataJSON="\\u12"</script>', "bad_album_json"),
    ],
)
def test_parse_current_page_failures(page, reason):
    with pytest.raises(AlbumParseError) as err:
        parse_album_html_json(page)
    assert err.value.reason == reason


def test_parse_api_v3():
    album = parse_album_api_v3(api_v3_body(MIXED, "https://i.imgur.com"), album_id="MixdAlb")
    assert album.source == "api-v3"
    assert _got(album) == _expected(MIXED)
    assert [im.ext for im in album.images] == ["jpg", "png", "gif", "jpg", "jpeg"]
    item = {"id": "Api0001", "type": "image/png", "link": None, "description": ""}
    body = {"data": [item], "success": True}
    assert parse_album_api_v3(body).images == [
        AlbumImage("Api0001", "png", "https://i.imgur.com/Api0001.png", None, False)
    ]


@pytest.mark.parametrize(
    "body, reason",
    [
        ("{oops", "bad_album_json"),
        ('{"data": {"error": "x"}, "success": false, "status": 404}', "album_not_found"),
        ('{"data": {"error": "x"}, "success": false, "status": 500}', "bad_album_json"),
        ('{"data": {}, "success": true, "status": 200}', "bad_album_json"),
        ("[1, 2]", "bad_album_json"),
    ],
)
def test_parse_api_v3_failures(body, reason):
    with pytest.raises(AlbumParseError) as err:
        parse_album_api_v3(body)
    assert err.value.reason == reason


_caption_text = st.text(
    st.characters(exclude_categories=("Cs", "Cc", "Co", "Cn")) | st.sampled_from("\n\t '\"\\<>&"),
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(captions=st.lists(st.one_of(st.none(), _caption_text), min_size=1, max_size=5))
def test_captions_roundtrip_through_every_format(captions):
    album = FixtureAlbum(
        "RndAlbm", [FixtureImage(f"Rnd{k:04d}", c, "jpg", k) for k, c in enumerate(captions)]
    )
    # What each format can carry: html.parser folds \r; whitespace is normalised everywhere.
    want = [_norm(unicodedata.normalize("NFC", c)) if c else None for c in captions]
    for got in (
        parse_album_html_2018(album_page_2018(album)),
        parse_album_html_json(album_page_json(album)),
        parse_album_api_v3(api_v3_body(album)),
        parse_album_hit_json(hit_json_body(album)),
    ):
        assert [im.hash for im in got.images] == [im.hash for im in album.images]
        assert [unicodedata.normalize("NFC", im.caption) if im.caption else None for im in got.images] == want


# -------------------------------------------------------------------- lone surrogates, deep JSON

SURROGATES = FixtureAlbum(
    "Surrgt1",
    [
        FixtureImage("Sur0001", "a \ud83d b", seed=1),  # lone high surrogate
        FixtureImage("Sur0002", "pair \ud83d\ude00 ok", seed=2),  # a pair, as two escapes: joined
        FixtureImage("Sur0003", "\ude00 low \ufffd", seed=3),  # lone low one next to a real U+FFFD
        FixtureImage("Sur0004", "plain", seed=4),
    ],
    style="json",
)
SURROGATES_WANT = ["a \ufffd b", "pair \U0001f600 ok", "\ufffd low \ufffd", "plain"]


@pytest.mark.parametrize(
    "parse, body",
    [
        (parse_album_hit_json, hit_json_body(SURROGATES)),
        (parse_album_api_v3, api_v3_body(SURROGATES)),
        (parse_album_html_json, album_page_json(SURROGATES)),  # \\ud83d inside the JS literal
    ],
)
def test_lone_surrogates_in_json_captions_are_repaired_and_counted(parse, body):
    assert "\\ud83d" in body  # the JSON escape json.loads turns into a lone surrogate
    album = parse(body)
    assert [im.caption for im in album.images] == SURROGATES_WANT
    assert album.captions_repaired == 2
    "".join(im.caption for im in album.images).encode("utf-8")  # a Parquet writer can take them


def test_lone_surrogates_elsewhere_are_repaired_too():
    # A JS-level escape in postDataJSON (not a JSON one) and a 2018 page given as text.
    page = (
        '<script>window.postDataJSON="{\\"media\\": [{\\"id\\": \\"Sur0001\\", '
        '\\"metadata\\": {\\"description\\": \\"x \\ud83d y\\"}}]}"</script>'
    )
    album = parse_album_html_json(page)
    assert [im.caption for im in album.images] == ["x \ufffd y"] and album.captions_repaired == 1
    html = (
        '<div id="Sur0001" class="post-image-container">'
        '<div class="post-image-description">x \ud83d y \ud83d\ude00</div></div>'
    )
    album = parse_album_html_2018(html)
    assert [im.caption for im in album.images] == ["x \ufffd y \U0001f600"] and album.captions_repaired == 1
    # Character references for surrogates are the HTML parser's to replace: no repair needed.
    assert parse_album_html_2018(album_page_2018(SURROGATES)).images[0].caption == "a \ufffd b"


_surrogate_text = st.text(
    st.sampled_from(["a", " ", "\n", "\ud83d", "\ude00", "\udbff", "\ufffd", "é", "\U0001f600"])
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(captions=st.lists(st.one_of(st.none(), _surrogate_text), min_size=1, max_size=5))
def test_json_captions_never_keep_a_surrogate(captions):
    album = FixtureAlbum(
        "RndSurr", [FixtureImage(f"Rnd{k:04d}", c, "jpg", k) for k, c in enumerate(captions)], style="json"
    )
    want = [_norm(repair_surrogates(c)[0]) if c else None for c in captions]
    repaired = sum(1 for c in captions if c and repair_surrogates(c)[1])
    for got in (
        parse_album_html_json(album_page_json(album)),
        parse_album_api_v3(api_v3_body(album)),
        parse_album_hit_json(hit_json_body(album)),
    ):
        assert [im.caption for im in got.images] == want
        assert got.captions_repaired == repaired
        for im in got.images:
            (im.caption or "").encode("utf-8")


DEEP = "[" * 100_000


@pytest.mark.parametrize(
    "parse, body",
    [
        (parse_album_hit_json, DEEP),
        (parse_album_hit_json, '{"data": ' * 50_000),
        (parse_album_api_v3, DEEP),
        (parse_album_api_v3, DEEP.encode()),
        (parse_album_html_json, f'<script>window.postDataJSON="{DEEP}"</script>'),
    ],
)
def test_deeply_nested_json_is_bad_album_json(parse, body):
    with pytest.raises(AlbumParseError) as err:  # json.loads raises RecursionError, not ValueError
        parse(body)
    assert err.value.reason == "bad_album_json"


# ------------------------------------------------------------------------------------ scraper


def _ctx(tmp_path: Path, **options: str):
    opts = {"polite": "false", "allow_private": "true", "http_cache": "off", "retries": "3", **options}
    return get_spec("diy").context(str(tmp_path), opts, str(tmp_path / "state"))


def _scraper(srv: ImgurFixtureServer, tmp_path: Path, *, state: bool = True, **kw) -> AlbumScraper:
    ctx = _ctx(tmp_path, **kw.pop("options", {}))
    client = PoliteClient(policy_from_context(ctx, {srv.host}))
    return AlbumScraper(
        client,
        CrawlState(str(tmp_path / "state")) if state else None,
        page_base=srv.base,
        api_base=srv.base,
        image_base=srv.base,
        **kw,
    )


@pytest.fixture()
def server():
    with ImgurFixtureServer(diy_albums(), client_id="fixture-client") as srv:
        yield srv


def test_scraper_results_and_crawl_state_prevent_refetch(server, tmp_path):
    first = _scraper(server, tmp_path)
    good = first.scrape("Good201")
    assert good.source == "html-2018" and len(good.images) == 5
    assert good.images[0].url == f"{server.base}/GaAaaa1.jpg"
    big = first.scrape("BigAlbm")
    assert len(big.images) == 6 and big.complete and big.images[5].caption.endswith("step 16")
    cur = first.scrape("GoodJsn")
    assert cur.source == "html-json" and [im.animated for im in cur.images] == [False, True, False, False]
    for album_id, reason in (
        ("Gone404", "album_not_found"),
        ("Gone410", "album_not_found"),
        ("NoMarkp", "no_album_markup"),
    ):
        with pytest.raises(AlbumFailed) as err:
            first.scrape(album_id)
        assert (err.value.reason, err.value.transient, err.value.recorded) == (reason, False, True)
    assert server.counts["/a/Good201"] == 1 and server.counts["/ajaxalbums/getimages/BigAlbm/hit.json"] == 1
    before = sum(server.counts.values())

    second = _scraper(server, tmp_path)  # a new process after a restart: same state folder
    assert second.scrape("Good201") == good
    assert second.scrape("BigAlbm") == big
    assert second.scrape("GoodJsn") == cur
    for album_id in ("Gone404", "Gone410", "NoMarkp"):
        with pytest.raises(AlbumFailed):
            second.scrape(album_id)
    assert sum(server.counts.values()) == before  # nothing fetched again


def test_scraper_without_fill_in_keeps_what_the_page_inlined(server, tmp_path):
    album = _scraper(server, tmp_path, fetch_all=False).scrape("BigAlbm")
    assert len(album.images) == 3 and not album.complete and album.declared_count == 6
    assert server.counts["/ajaxalbums/getimages/BigAlbm/hit.json"] == 0
    assert _scraper(server, tmp_path, fetch_all=False).scrape("BigAlbm") == album  # from the state
    assert server.counts["/a/BigAlbm"] == 1
    full = _scraper(server, tmp_path).scrape("BigAlbm")  # fetch_all switched on: completed once
    assert len(full.images) == 6 and full.complete
    assert _scraper(server, tmp_path).scrape("BigAlbm") == full
    assert server.counts["/a/BigAlbm"] == 2 and server.counts["/ajaxalbums/getimages/BigAlbm/hit.json"] == 1


def test_fill_in_endpoint_gone_or_failing(tmp_path):
    def big(album_id: str, status: int) -> FixtureAlbum:
        images = [FixtureImage(f"{album_id[:3]}000{k}", "c", seed=k) for k in range(4)]
        return FixtureAlbum(album_id, images, inline=2, hit_json_status=status)

    with ImgurFixtureServer([big("Partial", 404), big("Failing", 503)]) as srv:
        scraper = _scraper(srv, tmp_path, options={"retries": "0"})
        album = scraper.scrape("Partial")  # the endpoint is gone: keep what the page inlined
        assert len(album.images) == 2 and not album.complete
        assert CrawlState(str(tmp_path / "state")).done("album", scraper.state_key("Partial"))
        with pytest.raises(AlbumFailed) as err:  # failing now: no partial album is recorded
            scraper.scrape("Failing")
        assert err.value.transient
        assert not CrawlState(str(tmp_path / "state")).done("album", scraper.state_key("Failing"))


def test_scraper_api_v3(server, tmp_path):
    album = _scraper(server, tmp_path, client_id="fixture-client").scrape("Good201")
    assert album.source == "api-v3" and len(album.images) == 5
    assert server.counts["/3/album/Good201/images"] == 1 and server.counts["/a/Good201"] == 0
    with pytest.raises(AlbumFailed) as err:
        _scraper(server, tmp_path, client_id="fixture-client").scrape("Gone404")
    assert err.value.reason == "album_not_found" and err.value.recorded


def test_bad_client_id_is_transient_and_not_recorded(server, tmp_path):
    wrong = _scraper(server, tmp_path, client_id="wrong")
    with pytest.raises(AlbumFailed) as err:
        wrong.scrape("GoodJsn")
    assert err.value.transient and err.value.reason in ("forbidden", "retries_exhausted")
    assert not CrawlState(str(tmp_path / "state")).done("album", wrong.state_key("GoodJsn"))
    assert _scraper(server, tmp_path, client_id="fixture-client").scrape("GoodJsn").source == "api-v3"


def test_429_storm_is_retried_then_succeeds(tmp_path):
    album = FixtureAlbum("Stormy1", [FixtureImage("Stm0001", "a caption", seed=1)], storm=2)
    with ImgurFixtureServer([album]) as srv:
        got = _scraper(srv, tmp_path, options={"retries": "3"}).scrape("Stormy1")
        assert len(got.images) == 1 and srv.counts["/a/Stormy1"] == 3


def test_endless_429_is_transient_and_retried_next_run(tmp_path):
    album = FixtureAlbum("Stormy2", [FixtureImage("Stm0002", "a caption", seed=2)], storm=1000)
    with ImgurFixtureServer([album]) as srv:
        for _ in range(2):
            with pytest.raises(AlbumFailed) as err:
                _scraper(srv, tmp_path, options={"retries": "1"}).scrape("Stormy2")
            assert err.value.transient and not err.value.recorded
        assert srv.counts["/a/Stormy2"] == 4  # two runs x (1 try + 1 retry): nothing recorded


def test_policy_failures_are_permanent_but_not_recorded(tmp_path):
    albums = [
        FixtureAlbum(
            "Redirct", [FixtureImage("Red0001", "x", seed=1)], redirect_to="http://elsewhere.test/a/x"
        ),
        FixtureAlbum("HugePag", [FixtureImage("Hug0001", "x", seed=2)], style="huge", huge_bytes=300_000),
    ]
    with ImgurFixtureServer(albums) as srv:
        scraper = _scraper(srv, tmp_path, max_page_bytes=100_000)
        for album_id, reason in (("Redirct", "refused_host"), ("HugePag", "too_large")):
            with pytest.raises(AlbumFailed) as err:
                scraper.scrape(album_id)
            assert (err.value.reason, err.value.transient, err.value.recorded) == (reason, False, False)
            assert not CrawlState(str(tmp_path / "state")).done("album", scraper.state_key(album_id))
        assert _scraper(srv, tmp_path).scrape("HugePag").images[0].hash == "Hug0001"  # a larger limit


class _StubClient:
    """Answers every GET with one fixed response (or raises one HttpError)."""

    def __init__(self, status: int = 200, body: bytes = b"", error: HttpError | None = None):
        self.status, self.body, self.error, self.urls = status, body, error, []

    def get(self, url, **kw):
        self.urls.append(url)
        if self.error is not None:
            raise self.error
        return HttpResponse(url, self.status, {}, self.body)


@pytest.mark.parametrize(
    "status, body, error, reason, transient, recorded",
    [
        (404, b"", None, "album_not_found", False, True),
        (410, b"", None, "album_not_found", False, True),
        (200, b"<html>nothing</html>", None, "no_album_markup", False, True),
        (200, b'<script>window.postDataJSON="{oops"</script>', None, "bad_album_json", False, True),
        (403, b'{"data":{"error":"Imgur is temporarily over capacity"}}', None, "over_capacity", True, False),
        (401, b"", None, "forbidden", True, False),
        (429, b"", None, "http_429", True, False),
        (503, b"", None, "http_503", True, False),
        (400, b"", None, "http_400", False, False),
        (304, b"", None, "http_304", False, False),
        (0, b"", HttpError("retries_exhausted", "x", transient=True), "retries_exhausted", True, False),
        (0, b"", HttpError("refused_host", "x"), "refused_host", False, False),
        (0, b"", HttpError("too_large", "x"), "too_large", False, False),
        (200, f'<script>window.postDataJSON="{DEEP}"</script>'.encode(), None, "bad_album_json", False, True),
    ],
)
def test_failure_mapping(tmp_path, status, body, error, reason, transient, recorded):
    state = CrawlState(str(tmp_path))
    scraper = AlbumScraper(_StubClient(status, body, error), state)
    with pytest.raises(AlbumFailed) as err:
        scraper.scrape("Abcde12")
    assert (err.value.reason, err.value.transient, err.value.recorded) == (reason, transient, recorded)
    assert state.done("album", scraper.state_key("Abcde12")) == recorded


def test_repaired_captions_are_recorded_and_read_back(tmp_path):
    state = CrawlState(str(tmp_path))
    first = AlbumScraper(_StubClient(200, api_v3_body(SURROGATES).encode()), state, client_id="k")
    album = first.scrape("Surrgt1")  # the record is UTF-8 JSON: a lone surrogate would not encode
    assert [im.caption for im in album.images] == SURROGATES_WANT and album.captions_repaired == 2
    stub = _StubClient(error=HttpError("refused_host", "no request expected"))
    again = AlbumScraper(stub, state, client_id="k").scrape("Surrgt1")
    assert again == album and stub.urls == []


def test_records_are_keyed_by_route_and_base(tmp_path):
    state = CrawlState(str(tmp_path))
    live = AlbumScraper(_StubClient(404), state)
    with pytest.raises(AlbumFailed) as err:
        live.scrape("MixdAlb")
    assert (err.value.reason, err.value.recorded) == ("album_not_found", True)
    # The user points the page base at a web archive: live imgur's 404 is not the archive's answer.
    archive_base = "https://web.archive.org/web/2018id_/https://imgur.com"
    archived_client = _StubClient(200, album_page_2018(MIXED).encode())
    archived = AlbumScraper(archived_client, state, page_base=archive_base)
    album = archived.scrape("MixdAlb")
    assert len(album.images) == 5 and archived_client.urls == [f"{archive_base}/a/MixdAlb"]
    # The API route keeps its own records too.
    api_client = _StubClient(200, api_v3_body(MIXED).encode())
    assert AlbumScraper(api_client, state, client_id="k").scrape("MixdAlb").source == "api-v3"
    assert len(api_client.urls) == 1
    assert len({live.state_key("MixdAlb"), archived.state_key("MixdAlb"),
                AlbumScraper(api_client, state, client_id="k").state_key("MixdAlb")}) == 3  # fmt: skip
    # Each answer is reused for its own route and base, without a request.
    silent = _StubClient(error=HttpError("refused_host", "no request expected"))
    with pytest.raises(AlbumFailed) as err:
        AlbumScraper(silent, state).scrape("MixdAlb")
    assert err.value.recorded
    assert AlbumScraper(silent, state, page_base=archive_base).scrape("MixdAlb") == album
    assert AlbumScraper(silent, state, client_id="k").scrape("MixdAlb").source == "api-v3"
    assert silent.urls == []


def test_records_keep_no_image_urls_and_follow_the_current_image_base(tmp_path):
    state = CrawlState(str(tmp_path))
    first = AlbumScraper(
        _StubClient(200, album_page_2018(MIXED).encode()), state, image_base="https://i.imgur.com"
    )
    album = first.scrape("MixdAlb")
    rec = state.get("album", first.state_key("MixdAlb"))
    assert rec is not None and all(set(im) == {"hash", "ext", "caption", "animated"} for im in rec["images"])
    assert "i.imgur.com" not in json.dumps(rec)
    silent = _StubClient(error=HttpError("refused_host", "no request expected"))
    mirror = AlbumScraper(silent, state, image_base="http://mirror.test/img/").scrape("MixdAlb")
    assert silent.urls == []
    want = [f"http://mirror.test/img/{im.hash}.{im.ext}" for im in album.images]
    assert [im.url for im in mirror.images] == want
    assert [(im.hash, im.caption, im.animated) for im in mirror.images] == [
        (im.hash, im.caption, im.animated) for im in album.images
    ]


def test_old_and_broken_records_mean_scrape_again(tmp_path):
    state = CrawlState(str(tmp_path))
    state.put("album", "MixdAlb", {"failed": "album_not_found", "detail": "keyed by album id alone"})
    client = _StubClient(200, album_page_2018(MIXED).encode())
    scraper = AlbumScraper(client, state)
    assert len(scraper.scrape("MixdAlb").images) == 5 and len(client.urls) == 1
    rec = state.get("album", scraper.state_key("MixdAlb"))
    rec["images"][0]["hash"] = "../../x"
    state.put("album", scraper.state_key("MixdAlb"), rec)
    assert len(scraper.scrape("MixdAlb").images) == 5 and len(client.urls) == 2
    # A record written with URLs (an older layout) still reads, URLs rebuilt from the image base.
    image = {"hash": "Old0001", "ext": "png", "url": "https://old.test/Old0001.png", "caption": None}
    old = {"album_id": "A", "source": "api-v3", "images": [{**image, "animated": False}]}
    assert Album.from_record(old, image_base="http://new.test").images[0].url == "http://new.test/Old0001.png"


def test_base_urls_with_user_info_are_refused_and_details_are_redacted(tmp_path):
    for kw in ({"page_base": "https://u:s3cret@imgur.com"}, {"api_base": "https://tok3n@api.imgur.com"},
               {"image_base": "http://u:s3cret@i.imgur.com"}):  # fmt: skip
        with pytest.raises(MmlinksError) as err:
            AlbumScraper(_StubClient(), None, **kw)
        assert "s3cret" not in str(err.value) and "tok3n" not in str(err.value)
    # A query-string proxy whose key is in the base: dead-letter details show no query.
    proxy = AlbumScraper(
        _StubClient(404), CrawlState(str(tmp_path)), page_base="https://proxy.test/?key=S3CRET&u="
    )
    with pytest.raises(AlbumFailed) as err:
        proxy.scrape("MixdAlb")
    assert err.value.reason == "album_not_found" and "S3CRET" not in err.value.detail
    assert "proxy.test" in err.value.detail


def test_page_reusing_container_class_falls_back_to_embedded_json():
    reused = '<div id="root"><div class="post-image-container"></div></div>'
    page = album_page_json(MIXED).replace('<div id="root"></div>', reused)
    client = _StubClient(200, page.encode())
    album = AlbumScraper(client, None).scrape("MixdAlb")
    assert album.source == "html-json" and len(album.images) == 5
    assert client.urls == ["https://imgur.com/a/MixdAlb"]


def test_bad_album_id_is_refused_without_a_request(server, tmp_path):
    with pytest.raises(AlbumFailed) as err:
        _scraper(server, tmp_path).scrape("../../x")
    assert err.value.reason == "bad_album_id" and sum(server.counts.values()) == 0


# ---------------------------------------------------------------------------------- documents


def _dead(items) -> list[tuple[str, str, str]]:
    return [(d.tag, d.value.kind, d.value.reason) for d in items if isinstance(d, beam.pvalue.TaggedOutput)]


def test_document_from_album_links_and_animated_captions():
    from pipelines.sources.diy import document_from_album

    post = {"id": "abc", "title": "T", "permalink": "/r/DIY/x", "created_utc": 5, "score": 30, "url": "u"}
    images = [
        AlbumImage("A", "jpg", "u/A.jpg", "cap A", False),
        AlbumImage("B", "gif", "u/B.gif", "cap B", True),
        AlbumImage("C", "jpg", "u/C.jpg", None, False),
        AlbumImage("D", "png", "u/D.png", "cap D", False),
    ]
    out = list(document_from_album(post, Album("alb", images, "html-2018", declared_count=4)))
    (doc,) = [o for o in out if isinstance(o, RawDocument)]
    assert doc.doc_id == "diy-abc" and doc.source == "diy" and doc.split is None
    assert doc.image_uris == ["u/A.jpg", "u/C.jpg", "u/D.png"]
    assert doc.sentences == ["cap A", "cap B", "cap D"]
    assert doc.links == [(0, 0), (2, 2)]  # "cap B" stays, unlinked: its image was animated
    assert doc.metadata["album_id"] == "alb" and doc.metadata["score"] == "30"
    assert doc.metadata["title"] == "T" and "T" not in doc.sentences
    assert _dead(out) == [(DEAD_LETTER, "image", "animated")]

    only_gif = list(document_from_album(post, Album("g", images[1:2], "api-v3")))
    assert _dead(only_gif) == [(DEAD_LETTER, "image", "animated"), (DEAD_LETTER, "document", "only_animated")]
    assert _dead(document_from_album(post, Album("e", [], "html-json"))) == [
        (DEAD_LETTER, "document", "empty_album")
    ]


def test_document_from_album_counts_repaired_captions(monkeypatch):
    from pipelines.sources import diy

    counted: list[tuple[str, int]] = []
    monkeypatch.setattr(diy, "count", lambda name, n=1: counted.append((name, n)))
    post = {"id": "abc", "title": "T"}
    album = parse_album_api_v3(api_v3_body(SURROGATES), album_id="Surrgt1")
    (doc,) = [o for o in diy.document_from_album(post, album) if isinstance(o, RawDocument)]
    assert doc.sentences == SURROGATES_WANT
    assert ("captions_repaired", 2) in counted


class _Posts(beam.PTransform):
    """Stand-in for ReadCandidatePosts: fixed posts and one upstream dead letter."""

    def __init__(self, posts: list[dict]):
        super().__init__()
        self.posts = posts

    def expand(self, pbegin):
        return {
            "posts": pbegin | "Posts" >> beam.Create(self.posts),
            DEAD_LETTER: pbegin | "Upstream" >> beam.Create([DeadLetter("line", "x", "malformed_record")]),
        }


def _run_diy(ctx, posts: list[dict], check_docs, check_dead) -> None:
    from pipelines.sources.base import source_outputs
    from pipelines.sources.diy import ReadDiy

    with beam.Pipeline(runner=DirectRunner()) as p:
        docs, dead = source_outputs(p | ReadDiy(ctx, candidates=_Posts(posts)))
        assert_that(docs, check_docs, label="Docs")
        assert_that(dead, check_dead, label="Dead")


def test_read_diy_end_to_end(tmp_path):
    albums = [*diy_albums(), FixtureAlbum("Stormy3", [FixtureImage("Stm0003", "c", seed=9)], storm=10_000)]
    with ImgurFixtureServer(albums) as srv:
        posts = candidate_posts(albums, page_base=srv.base)
        posts.append({**posts[0], "id": "notalb", "url": "https://i.imgur.com/GaAaaa1.jpg", "album_id": None})
        ctx = _ctx(
            tmp_path,
            imgur_page_base=srv.base,
            imgur_image_base=srv.base,
            retries="1",
            min_score="25",
        )
        by_album = {p["album_id"]: f"diy-{p['id']}" for p in posts if p["album_id"]}
        base = srv.base  # the checks are pickled: they must not hold the server

        def check_docs(docs):
            got = {d.doc_id: d for d in docs}
            assert sorted(got) == sorted(by_album[a] for a in ("Good201", "GoodJsn", "BigAlbm", "Deleted"))
            good = got[by_album["Good201"]]
            assert good.image_uris == [f"{base}/GaAaaa{k}.jpg" for k in range(1, 6)]
            assert good.links == [(0, 0), (1, 1), (2, 3), (3, 4)] and len(good.sentences) == 4
            assert good.metadata["album_source"] == "html-2018" and good.metadata["post_id"] == "p0"
            cur = got[by_album["GoodJsn"]]
            assert len(cur.image_uris) == 3 and len(cur.sentences) == 4
            assert cur.links == [(0, 0), (2, 1), (3, 2)]
            assert len(got[by_album["BigAlbm"]].image_uris) == 6
            assert all(d.split is None and d.source == "diy" for d in docs)

        def check_dead(dead):
            got = sorted((d.kind, d.source_id, d.reason) for d in dead)
            want = sorted(
                [
                    ("line", "x", "malformed_record"),
                    ("document", by_album["Gone404"], "album_not_found"),
                    ("document", by_album["Gone410"], "album_not_found"),
                    ("document", by_album["NoMarkp"], "no_album_markup"),
                    ("document", by_album["EmptyAl"], "empty_album"),
                    ("document", by_album["OnlyGif"], "only_animated"),
                    ("image", f"{by_album['OnlyGif']}#image-0", "animated"),
                    ("image", f"{by_album['OnlyGif']}#image-1", "animated"),
                    ("image", f"{by_album['GoodJsn']}#image-1", "animated"),
                    ("document", by_album["Stormy3"], "retries_exhausted"),
                    ("document", "diy-notalb", "not_album_url"),
                ]
            )
            assert got == want, got
            (storm,) = [d for d in dead if d.source_id == by_album["Stormy3"]]
            assert "transient" in storm.detail

        _run_diy(ctx, posts, check_docs, check_dead)
        pages = {k: v for k, v in srv.counts.items() if k.startswith("/a/")}
        assert pages["/a/Good201"] == 1 and pages["/a/Stormy3"] == 2

        # A rerun (same crawl state) fetches only the album whose failure was transient.
        srv.reset_counts()
        _run_diy(ctx, posts, check_docs, check_dead)
        assert {k: v for k, v in srv.counts.items() if k.startswith("/a/")} == {"/a/Stormy3": 2}


def test_read_diy_repairs_lone_surrogates_and_counts_them(tmp_path):
    from apache_beam.metrics.metric import MetricsFilter

    from pipelines.sources.base import source_outputs
    from pipelines.sources.diy import ReadDiy

    with ImgurFixtureServer([SURROGATES]) as srv:
        posts = candidate_posts([SURROGATES], page_base=srv.base)
        ctx = _ctx(tmp_path, imgur_page_base=srv.base, imgur_image_base=srv.base)

        def check_docs(docs):
            assert [d.sentences for d in docs] == [SURROGATES_WANT]

        p = beam.Pipeline(runner=DirectRunner())
        docs, _dead_letters = source_outputs(p | ReadDiy(ctx, candidates=_Posts(posts)))
        assert_that(docs, check_docs)
        result = p.run()
        result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("captions_repaired"))["counters"]
    assert sum(c.committed for c in counters) == 2


def test_read_diy_from_a_reddit_dump(tmp_path):
    """The real ReadCandidatePosts on a dump file -> albums scraped from the fixture server."""
    from tests.fixtures.reddit import submission, write_dump

    records = [
        submission("aaa1", url="https://imgur.com/a/Good201"),
        submission("aaa2", url="http://m.imgur.com/a/GoodJsn#0"),
        submission("aaa3", url="https://imgur.com/a/Gone404"),
        submission("aaa4", url="https://imgur.com/a/BigAlbm", score=3),  # under min_score
        submission("aaa5", url="https://imgur.com/a/NoMarkp", subreddit="woodworking"),
    ]
    dump = write_dump(tmp_path / "dumps" / "RS_2015-01.zst", records)
    with ImgurFixtureServer(diy_albums()) as srv:
        ctx = get_spec("diy").context(
            str(dump.parent),
            {
                "polite": "false",
                "allow_private": "true",
                "http_cache": "off",
                "refresh_scores": "false",
                "imgur_page_base": srv.base,
                "imgur_image_base": srv.base,
            },
            str(tmp_path / "state"),
        )
        get_spec("diy").check(ctx)
        from pipelines.sources.base import source_outputs

        def check_docs(docs):
            assert sorted(d.doc_id for d in docs) == ["diy-aaa1", "diy-aaa2"]
            assert all(d.metadata["score"] == "120" and d.metadata["created_utc"] for d in docs)

        def check_dead(dead):
            got = {(d.kind, d.source_id, d.reason) for d in dead}
            assert ("document", "diy-aaa3", "album_not_found") in got

        with beam.Pipeline(runner=DirectRunner()) as p:
            docs, dead = source_outputs(p | get_spec("diy").make(ctx))
            assert_that(docs, check_docs, label="Docs")
            assert_that(dead, check_dead, label="Dead")
        assert srv.counts["/a/BigAlbm"] == 0 and srv.counts["/a/NoMarkp"] == 0  # filtered upstream


# --------------------------------------------------------------------------------------- spec


def test_diy_spec(tmp_path, monkeypatch):
    spec = get_spec("diy")
    assert spec.build_defaults == {"filter_preset": "diy"}
    assert "IMGUR_CLIENT_ID" in spec.credentials and "praw_client_id" in spec.credentials
    names = {o.name for o in spec.options}
    assert {"subreddit", "min_score", "imgur_page_base", "imgur_image_base", "rate", "polite"} <= names
    data = spec.data_options(
        {"rate": "3", "imgur_page_base": "https://web.archive.org/web/2018/https://imgur.com"}
    )
    assert data == {"imgur_page_base": "https://web.archive.org/web/2018/https://imgur.com"}

    dump = tmp_path / "RS_2015-01.zst"
    dump.write_bytes(b"x")  # check() looks for submission files; it does not read them
    spec.check(spec.context(str(dump), {}, str(tmp_path / "s")))
    spec.check(spec.context(str(tmp_path), {}, str(tmp_path / "s")))
    for bad in (
        spec.context(str(tmp_path / "missing"), {}, str(tmp_path / "s")),
        spec.context(str(dump), {"rate": "fast"}, str(tmp_path / "s")),
        spec.context(str(dump), {"imgur_page_base": "imgur.com"}, str(tmp_path / "s")),
        spec.context(str(dump), {"imgur_full_albums": "maybe"}, str(tmp_path / "s")),
    ):
        with pytest.raises(MmlinksError):
            spec.check(bad)
    for option, value in (
        ("imgur_page_base", "https://user:s3cret@imgur.com"),
        ("imgur_api_base", "https://s3cret@api.imgur.com"),
        ("imgur_image_base", "http://u:s3cret@127.0.0.1:8080"),
        ("imgur_page_base", "user:s3cret@imgur.com"),  # no scheme: refused, still not echoed
    ):
        with pytest.raises(MmlinksError) as err:
            spec.check(spec.context(str(dump), {option: value}, str(tmp_path / "s")))
        assert "s3cret" not in str(err.value), str(err.value)
    with pytest.raises(MmlinksError) as err:  # the image fetcher refuses it too
        spec.fetcher(spec.context(str(dump), {"imgur_image_base": "http://u:s3cret@i.imgur.com"}, "s"))
    assert "s3cret" not in str(err.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a dump")
    outside = tmp_path / "old" / "RS_2011-05.zst"  # a month outside start..end
    outside.parent.mkdir()
    outside.write_bytes(b"x")
    for folder in (empty, outside.parent):
        with pytest.raises(MmlinksError, match="no Reddit submission files"):
            spec.check(spec.context(str(folder), {}, str(tmp_path / "s")))


def test_diy_fetcher_reads_images_and_sees_removed_placeholder(server, tmp_path):
    spec = get_spec("diy")
    ctx = _ctx(tmp_path, imgur_image_base=server.base)
    fetcher = spec.fetcher(ctx)
    got = fetcher.fetch(f"{server.base}/GaAaaa1.jpg", 1 << 20)
    assert got.data[:2] == b"\xff\xd8"
    removed = fetcher.fetch(f"{server.base}/GdDddd2.jpg", 1 << 20)
    assert removed.final_uri.endswith("/removed.png")
