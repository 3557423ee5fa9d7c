"""Fuzzing every record parser of the sources (issue #19): whatever the bytes, a parser returns a
record or raises the one error type its Beam step turns into a dead letter with a reason; the
per-line Beam steps never raise, and every record they do not keep is a dead letter with a
reason or a counted filter."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pipelines.records import DEAD_LETTER, DeadLetter
from pipelines.sources.imgur import parsers as imgur
from pipelines.sources.imgur.album import Album, AlbumParseError
from pipelines.sources.recipeqa import parse_item
from pipelines.sources.reddit.config import POST_KEYS
from pipelines.sources.vist import parse_element
from pipelines.sources.wiki.imageclef import ImageMetadata, parse_image_metadata
from pipelines.sources.wiki.mediawiki import ParseTitles, file_names_in_html
from tests.faults.conftest import FUZZ
from tests.fixtures.reddit import submission

pytestmark = [pytest.mark.faults, pytest.mark.slow]
EXAMPLES = FUZZ  # 60 examples per parser in the suite, 300 under benchmarks/faults.py

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)


def _dead_letters(outputs) -> list[DeadLetter]:
    dead = [o.value for o in outputs if getattr(o, "tag", None) == DEAD_LETTER]
    assert all(isinstance(d, DeadLetter) and d.reason and d.kind for d in dead)
    return dead


# --------------------------------------------------------------------------------- imgur eras


@st.composite
def imgur_bodies(draw):
    """The three eras' shapes with random content: 2018 markup, postDataJSON, API v3, hit.json."""
    value = draw(json_values)
    media = draw(st.lists(json_values, max_size=3))
    kind = draw(st.sampled_from(["page2018", "postdata", "api", "hit", "raw"]))
    if kind == "page2018":
        items = "".join(
            f'<div class="post-image-container" id="{draw(st.text(max_size=8))}">'
            f'<div class="post-image-description">{draw(st.text(max_size=20))}</div></div>'
            for _ in range(draw(st.integers(0, 3)))
        )
        return f"<html><body>{items}{draw(st.text(max_size=40))}</body></html>"
    if kind == "postdata":
        payload = json.dumps({"media": media, "x": value})
        literal = draw(st.sampled_from([json.dumps(payload), payload, json.dumps(payload)[:-3]]))
        return f"<script>window.postDataJSON={literal}</script>"
    if kind == "api":
        return json.dumps(
            {"data": draw(st.sampled_from([media, value])), "success": draw(scalars), "status": 200}
        )
    if kind == "hit":
        return json.dumps({"data": {"images": media, "count": draw(scalars)}})
    return draw(st.text(max_size=200))


@EXAMPLES
@given(body=imgur_bodies())
def test_imgur_parsers_return_an_album_or_a_reasoned_parse_error(body, fault_stats):
    fault_stats.add(inputs_fuzzed=1)
    for parse in (imgur.parse_album_html_2018, imgur.parse_album_html_json, imgur.parse_album_api_v3):
        try:
            album = parse(body, album_id="abcde")
        except AlbumParseError as exc:
            assert exc.reason in ("no_album_markup", "bad_album_json", "album_not_found")
        else:
            assert isinstance(album, Album)
            assert all(isinstance(i.url, str) and i.url for i in album.images)
        fault_stats.add(invariant_checks=1)
    try:
        imgur.parse_album_hit_json(body, album_id="abcde")
    except AlbumParseError as exc:
        assert exc.reason in ("bad_album_json", "album_not_found")


@EXAMPLES
@given(text=st.text(max_size=80))
def test_js_string_decoding_returns_text_or_a_js_string_error(text, fault_stats):
    fault_stats.add(inputs_fuzzed=1, invariant_checks=1)
    try:
        assert isinstance(imgur.decode_js_string(text), str)
    except imgur.JsStringError:
        pass


# ----------------------------------------------------------------------------- Reddit dumps


@st.composite
def dump_lines(draw) -> bytes:
    """A dump line: a real submission with fields replaced by random JSON, or random bytes."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200)) + b' "diy" '
    rec = submission(draw(st.text("abc123", min_size=1, max_size=6)))
    for key in draw(st.lists(st.sampled_from(sorted(rec)), max_size=5)):
        rec[key] = draw(json_values)
    text = json.dumps(rec)
    cut = draw(st.integers(0, len(text)))
    return (text if draw(st.booleans()) else text[:cut]).encode()


@EXAMPLES
@given(line=dump_lines())
def test_reddit_dump_lines_become_posts_or_reasoned_dead_letters(line, fault_stats):
    from pipelines.sources.reddit.config import RedditConfig
    from pipelines.sources.reddit.normalise import ParseSubmissions

    fault_stats.add(inputs_fuzzed=1, invariant_checks=1)
    config = RedditConfig("diy", 0, 2**40, 0, "false", None)
    step = ParseSubmissions(config)
    outputs = list(step.process(("RS_2015-01.zst", 1, line)))
    dead = _dead_letters(outputs)
    posts = [o for o in outputs if isinstance(o, dict)]
    assert len(dead) + len(posts) <= 1 and len(outputs) == len(dead) + len(posts)
    assert {d.reason for d in dead} <= {"not_utf8", "malformed_json", "malformed_submission"}
    for post in posts:
        assert post["subreddit"].lower() == "diy" and isinstance(post["created_utc"], int)
        assert set(post) >= set(POST_KEYS) - {"dump_score", "score_refreshed", "album_id", "album_kind"}


# ------------------------------------------------------------------ MediaWiki and ImageCLEF


@EXAMPLES
@example(raw=b"", html="\x85")
@given(raw=st.binary(max_size=120), html=st.text(max_size=300))
def test_mediawiki_titles_and_html(raw, html, fault_stats):
    # Found by this test: an href "File:" + whitespace (U+0085) gave an empty file name.
    fault_stats.add(inputs_fuzzed=2, invariant_checks=2)
    outputs = list(ParseTitles().process(raw))
    dead = _dead_letters(outputs)
    assert {d.reason for d in dead} <= {"not_utf8"} and len(outputs) <= 1
    page = f'<div><a href="/wiki/File:{html[:40]}">x</a>{html}</div>'
    assert all(isinstance(n, str) and n for n in file_names_in_html(page))


_WIKI_FILES = ["Alpha view.jpg", "Beta view.jpg", "Gamma map.svg"]
_WIKI_PARAGRAPHS = ["The river was wide. The bridge was old.", "The town was small. The market was loud."]
_WIKI_IMAGES = "http://upload.example/"  # the reader never fetches them: any host will do


def _real_api_bodies() -> dict[str, bytes]:
    """What the API answers for one article, in the real ``formatversion=2`` shape."""
    from tests.fixtures.wiki import imageinfo_response, parse_html, parse_response

    html = parse_html("Fuzz page", _WIKI_PARAGRAPHS, _WIKI_FILES)
    infos = {
        n: {
            "url": _WIKI_IMAGES + n.replace(" ", "_"),
            "mime": "image/svg+xml" if n.endswith(".svg") else "image/jpeg",
            "width": 800,
            "height": 600,
        }
        for n in _WIKI_FILES
    }
    return {
        "parse": parse_response("Fuzz page", 4242, html, sorted(_WIKI_FILES)),
        "query": imageinfo_response(infos),
    }


def _json_paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_paths(v, (*prefix, k))
    elif isinstance(value, list):
        for k, v in enumerate(value):
            yield from _json_paths(v, (*prefix, k))


@st.composite
def mediawiki_exchanges(draw) -> tuple[str, dict[str, bytes]]:
    """(mode, bodies by action): the real answers, one of them with values swapped for random
    JSON at random places, cut short, or replaced by random bytes."""
    bodies = _real_api_bodies()
    mode = draw(st.sampled_from(["intact", "replace", "replace", "cut", "bytes"]))
    if mode == "intact":
        return mode, bodies
    action = draw(st.sampled_from(sorted(bodies)))
    if mode == "bytes":
        bodies[action] = draw(st.binary(max_size=200))
    elif mode == "cut":
        bodies[action] = bodies[action][: draw(st.integers(0, len(bodies[action]) - 1))]
    else:
        doc = json.loads(bodies[action])
        paths = list(_json_paths(doc))
        for path in draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3)):
            if not path:
                doc = draw(json_values)
                continue
            parent = doc
            try:
                for key in path[:-1]:
                    parent = parent[key]
                parent[path[-1]] = draw(json_values)
            except (KeyError, IndexError, TypeError):  # an earlier swap removed the path
                pass
        bodies[action] = json.dumps(doc).encode()
    return mode, bodies


@pytest.fixture(scope="module")
def mediawiki_api():
    """A loopback ``/w/api.php`` answering each action with ``bodies[action]`` (set per example)."""
    from tests.pipelines.test_http_client import FixtureServer, send

    bodies: dict[str, bytes] = {}

    def app(h):
        action = "parse" if "action=parse" in h.path else "query"
        send(h, 200, bodies[action], {"Content-Type": "application/json; charset=utf-8"})

    server = FixtureServer(app)
    yield server, bodies
    server.close()


@EXAMPLES
@given(exchange=mediawiki_exchanges())
def test_mediawiki_api_responses_become_documents_or_reasoned_dead_letters(
    exchange, mediawiki_api, tmp_path_factory, fault_stats
):
    """The real reader (``MediaWikiArticles.process`` over the polite client) against fuzzed
    API answers served over loopback HTTP. Found by this test's first version: a non-list
    ``parse.images``, a non-string ``parse.text``, a list ``query`` or a ``"wide"`` image width
    raised out of the Beam step instead of dead-lettering the article."""
    from pipelines.records import RawDocument
    from pipelines.sources.wiki.mediawiki import MediaWikiArticles
    from pipelines.text_segmentation import split_sentences
    from tests.pipelines.test_http_client import make_client

    mode, bodies = exchange
    server, served = mediawiki_api
    served.clear()
    served.update(bodies)
    fn = MediaWikiArticles(
        make_client(server, max_retries=0),
        server.url(""),
        "upload.example",
        str(tmp_path_factory.mktemp("mw-state")),
    )
    fn.setup()
    outputs = list(fn.process("Fuzz page"))
    fault_stats.add(inputs_fuzzed=1, invariant_checks=1, faults_injected=int(mode != "intact"))
    dead = _dead_letters(outputs)
    docs = [o for o in outputs if isinstance(o, RawDocument)]
    assert len(outputs) == 1 and len(docs) + len(dead) == 1, outputs
    assert {d.reason for d in dead} <= {"bad_response", "api_error", "missing_title", "invalid_title"}
    assert all(d.detail and d.source_id == "Fuzz page" for d in dead)
    for doc in docs:
        assert all(isinstance(s, str) for s in doc.sentences)
        assert all(isinstance(u, str) and u for u in doc.image_uris)
    if mode == "intact":
        (doc,) = docs
        assert doc.doc_id == "wiki-4242"
        assert doc.sentences == [s for p in _WIKI_PARAGRAPHS for s in split_sentences(p)]
        assert doc.image_uris == [_WIKI_IMAGES + "Alpha_view.jpg", _WIKI_IMAGES + "Beta_view.jpg"]


@st.composite
def image_xml(draw) -> bytes:
    caption = f'<caption article="{draw(st.text(max_size=12))}">{draw(st.text(max_size=20))}</caption>'
    text = f'<text xml:lang="{draw(st.sampled_from(["en", "de", "", "EN"]))}">{caption}</text>'
    doc = f'<image id="{draw(st.text(max_size=8))}" file="{draw(st.text(max_size=12))}">{text}</image>'
    raw = doc.encode()
    mode = draw(st.sampled_from(["whole", "cut", "bytes", "deep"]))
    if mode == "cut":
        return raw[: draw(st.integers(0, len(raw)))]
    if mode == "bytes":
        return draw(st.binary(max_size=200))
    if mode == "deep":
        n = draw(st.integers(1, 200_000))
        return b"<image>" + b"<a>" * n + b"</a>" * n + b"</image>"
    return raw


@EXAMPLES
@given(data=image_xml())
def test_imageclef_metadata_is_parsed_or_a_value_error(data, fault_stats):
    fault_stats.add(inputs_fuzzed=1, invariant_checks=1)
    try:
        meta = parse_image_metadata(data, "metadata/7/123.xml", ["en"])
    except ValueError:
        return
    assert isinstance(meta, ImageMetadata) and meta.image_id


# --------------------------------------------------------------------- RecipeQA, VIST, COCO


@EXAMPLES
@given(
    item=json_values
    | st.fixed_dictionaries(
        {"context": st.lists(json_values, max_size=3)},
        optional={"recipe_id": json_values, "qid": json_values},
    )
)
def test_recipeqa_items_are_parsed_or_a_value_error(item, fault_stats):
    fault_stats.add(inputs_fuzzed=1, invariant_checks=1)
    try:
        out = parse_item(item)
    except ValueError:
        return
    assert out["steps"] and all(isinstance(t, str) and isinstance(b, str) for t, b, _ in out["steps"])


vist_entries = st.fixed_dictionaries(
    {},
    optional={
        k: json_values
        for k in ("photo_flickr_id", "album_id", "photo_order_in_story", "story_id", "text", "original_text")
    },
)


@EXAMPLES
@given(entry=vist_entries | st.lists(vist_entries, max_size=2) | json_values)
def test_vist_annotations_are_parsed_or_a_value_error(entry, fault_stats):
    fault_stats.add(inputs_fuzzed=1, invariant_checks=1)
    try:
        out = parse_element(entry, "photo_order_in_story", None, True)
    except ValueError:
        return
    assert out["photo"] and isinstance(out["order"], int) and isinstance(out["text"], str)


@EXAMPLES
@given(value=json_values | st.text(alphabet="0123456789", min_size=4000, max_size=5000))
def test_mscoco_ids_are_integers_or_a_value_error(value, fault_stats):
    from pipelines.sources.mscoco import _int_id

    fault_stats.add(inputs_fuzzed=1, invariant_checks=1)
    try:
        assert isinstance(_int_id(value), int)
    except ValueError:
        pass


# ---------------------------------------------------------------------- hessel (docs.json)

hessel_pair = st.lists(st.text(max_size=6) | st.integers(-2, 4) | json_values, max_size=3)


@EXAMPLES
@given(
    raw=st.lists(st.lists(hessel_pair, max_size=4) | json_values, min_size=2, max_size=3) | json_values,
)
def test_hessel_documents_are_assembled_or_dead_lettered(raw, fault_stats):
    import numpy as np

    from pipelines.sources.hessel import AssembleHesselDocs
    from schemas.document import Document

    fault_stats.add(inputs_fuzzed=1, invariant_checks=1)
    step = AssembleHesselDocs("features.npy", "id2row.json", "diy")
    step.features = np.ones((3, 4), np.float32)  # what setup() would load
    step.id2row = {"a": 0, "b": 1, "c": 2, "0": 5}
    outputs = list(step.process(("train", 7, raw)))
    dead = _dead_letters(outputs)
    docs = [o for o in outputs if isinstance(o, Document)]
    assert len(docs) + len(dead) == len(outputs) and len(docs) <= 1
    for doc in docs:
        assert doc.images and all(
            0 <= s < len(doc.sentences) and 0 <= i < len(doc.images) for s, i in doc.links or []
        )
