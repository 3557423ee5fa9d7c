"""Fuzzing the streaming readers (issue #19): whole files (RecipeQA splits, MSCOCO caption files,
VIST annotations, hessel's ``docs.json``, GoodNews's ``captioning_dataset.json``) and news JSONL
lines (the news and NYTimes800k exports), whole, cut, with a flipped byte, invalid UTF-8, a value
nested thousands deep, or random bytes, read by the sources' own Beam steps.

Invariants: the step never raises and ends within ``BOUND_S`` seconds (a guard, not a timing
measurement); every output is a record or a dead letter with a kind and a reason from the step's
own list; a file is one ``malformed_*`` dead letter exactly when ``json.loads`` (the oracle)
refuses it, nests deeper than ``jsonstream.MAX_DEPTH`` or lacks its arrays; and in a file the
oracle reads, every item is kept or dead-lettered (counted against the oracle's item count).
``tests/faults/test_parser_fuzz.py`` fuzzes the per-item parsers these steps call.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pipelines.records import DEAD_LETTER, DeadLetter, RawDocument
from pipelines.sources.jsonstream import MAX_DEPTH, depth
from tests.faults.conftest import FUZZ
from tests.faults.test_parser_fuzz import json_values

pytestmark = [pytest.mark.faults, pytest.mark.slow]
EXAMPLES = FUZZ  # 60 files per reader in the suite, 300 under benchmarks/faults.py
BOUND_S = 20  # per example: a hang fails the test instead of stalling the suite
DEEP = "\x00deep\x00"  # a placeholder replaced in the encoded text by a (too) deep value or a huge integer
ODD_VALUES = (  # what replaces DEEP: ordinary, just within the nesting cap, past it, a huge integer
    "[1]",
    "[" * 95 + "]" * 95,
    "[" * 5000 + "]" * 5000,
    '{"a":' * 3000 + "1" + "}" * 3000,
    "9" * 5000,
    '"an escaped lone surrogate \\ud83d"',  # valid JSON; no encoder (Beam's coders) takes it
)
KINDS = {"line", "document", "sentence", "image", "link"}


@contextlib.contextmanager
def bounded(seconds: int = BOUND_S):
    """Fail (TimeoutError) when the body runs longer than ``seconds`` (SIGALRM, main thread)."""

    def expire(signum, frame):
        raise TimeoutError(f"the reader took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@st.composite
def damaged(draw, doc) -> bytes:
    """``doc`` encoded, then whole, cut, with a byte replaced, invalid UTF-8 inside a string,
    a value nested deeper than the cap (or just within it), an integer of 5000 digits (past
    Python's conversion limit), or replaced by random bytes."""
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1])))
    raw = text.replace(json.dumps(DEEP), draw(st.sampled_from(ODD_VALUES))).encode()
    mode = draw(st.sampled_from(["whole", "whole", "cut", "flip", "bad_utf8", "bytes"]))
    if mode == "cut":
        return raw[: draw(st.integers(0, len(raw)))]
    if mode == "flip" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    if mode == "bad_utf8":
        quotes = [i for i, b in enumerate(raw) if b == ord('"')] or [0]
        at = draw(st.sampled_from(quotes)) + 1
        return raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + raw[at:]
    if mode == "bytes":
        return draw(st.binary(max_size=300))
    return raw


class Pairs(list):
    """A JSON object as its (key, value) pairs: repeated keys are all kept, as the stream reads them."""


def oracle(raw: bytes, keys: tuple[str, ...], required: tuple[str, ...] = ()) -> int | None:
    """The items of the arrays under ``keys`` that ``json.loads`` finds in ``raw`` (decoded as
    ``text_chunks`` does); None when it is not such a file: no JSON, not an object, too deep, an
    array key holding something else, a required array missing."""
    text = codecs.decode(raw, "utf-8", "surrogateescape").removeprefix("\ufeff")
    try:
        doc = json.loads(text, object_pairs_hook=Pairs)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, Pairs) or depth(doc) > MAX_DEPTH:
        return None
    arrays = [v for k, v in doc if k in keys]
    if any(not isinstance(v, list) or isinstance(v, Pairs) for v in arrays):
        return None
    if not set(required) <= {k for k, _ in doc}:
        return None
    return sum(len(v) for v in arrays)


def run_step(fn, element) -> tuple[list, list[DeadLetter]]:
    """(records, dead letters) of one ``process`` call, within the time bound; a DeadLetter
    always carries a kind and a reason."""
    with bounded():
        outputs = list(fn.process(element))
    dead = [o.value for o in outputs if getattr(o, "tag", None) == DEAD_LETTER]
    kept = [o for o in outputs if getattr(o, "tag", None) != DEAD_LETTER]
    assert all(isinstance(d, DeadLetter) and d.kind in KINDS and d.reason for d in dead)
    return kept, dead


@contextlib.contextmanager
def written(raw: bytes, name: str) -> Iterator[tuple[str, str]]:
    """A fresh folder holding ``raw`` as the file ``name``: (the folder, the file's path)."""
    with tempfile.TemporaryDirectory() as root:
        path = str(Path(root) / name)
        Path(path).write_bytes(raw)
        yield root, path


def encodable(doc: RawDocument) -> bool:
    """Whether Beam's coders can encode the document's strings (no lone surrogate anywhere)."""
    texts = [doc.doc_id, *doc.sentences, *doc.image_uris, *doc.metadata, *doc.metadata.values()]
    try:
        for text in texts:
            text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_file(kept, dead, expected, file_reasons, item_reasons, is_file_letter) -> int:
    """The file-level invariant; returns the items read (kept + item dead letters)."""
    file_letters = [d for d in dead if is_file_letter(d)]
    items = [d for d in dead if not is_file_letter(d)]
    assert {d.reason for d in items} <= item_reasons, dead
    if expected is None:  # a broken file: one dead letter for it, after the items before the fault
        assert [d.reason for d in file_letters] in ([r] for r in file_reasons), dead
        assert is_file_letter(dead[-1]), dead  # the reader stopped at the fault
    else:
        assert not file_letters, dead
    return len(kept) + len(items)


# ------------------------------------------------------------------------------------ RecipeQA

recipe_items = st.fixed_dictionaries(
    {
        "context": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.text(max_size=4),
                    "body": st.text(max_size=10),
                    "images": st.lists(st.text(max_size=6), max_size=2),
                }
            ),
            max_size=3,
        )
    },
    optional={"recipe_id": st.text(max_size=6), "qid": st.text(max_size=6), "task": json_values},
)


@EXAMPLES
@given(
    raw=st.lists(recipe_items | json_values | st.just(DEEP), max_size=5).flatmap(
        lambda data: damaged({"data": data, "version": "1"})
    )
)
def test_recipeqa_split_files_keep_or_dead_letter_every_item(raw, fault_stats):
    from pipelines.sources.recipeqa import ReadSplitFile

    fault_stats.add(inputs_fuzzed=1)
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "train.json").write_bytes(raw)
        kept, dead = run_step(ReadSplitFile(root, include_test=False), "train")
    expected = oracle(raw, ("data",), ("data",))
    read = check_file(
        kept,
        dead,
        expected,
        {"malformed_split_file"},
        {"not_utf8", "malformed_item"},
        lambda d: d.source_id == "train.json",
    )
    assert all(split == "train" and isinstance(c, dict) for (split, _), c in kept)
    if expected is not None:
        assert read == expected
    fault_stats.add(invariant_checks=3)


# -------------------------------------------------------------------------------------- MSCOCO

coco_images = st.fixed_dictionaries(
    {"id": st.integers(0, 6) | json_values, "file_name": st.sampled_from(["a.jpg", "b.jpg", "x/y.jpg", ""])}
)
coco_captions = st.fixed_dictionaries(
    {
        "id": st.integers(0, 99),
        "image_id": st.integers(0, 8) | json_values,
        "caption": st.text(max_size=12) | json_values,
    }
)


@EXAMPLES
@given(
    raw=st.tuples(
        st.lists(coco_images | json_values | st.just(DEEP), max_size=5),
        st.lists(coco_captions | json_values, max_size=6),
    ).flatmap(lambda ia: damaged({"info": {"year": 2014}, "images": ia[0], "annotations": ia[1]}))
)
def test_mscoco_caption_files_keep_or_dead_letter_every_entry(raw, fault_stats):
    from pipelines.sources.mscoco import ReadCaptionFile

    fault_stats.add(inputs_fuzzed=1)
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "annotations").mkdir()
        (Path(root) / "annotations" / "captions_train2014.json").write_bytes(raw)
        kept, dead = run_step(ReadCaptionFile(root), (0, "2014", "train"))
    expected = oracle(raw, ("images", "annotations"))
    check_file(
        kept,
        dead,
        expected,
        {"malformed_annotation_file"},
        {"not_utf8", "malformed_entry", "duplicate_image", "unknown_image"},
        lambda d: d.source_id == "annotations/captions_train2014.json",
    )
    assert all(tag == "pool" and isinstance(image_id, int) for tag, (_, image_id, _, _) in kept)
    if expected is not None:  # every entry: an image kept, a caption on one, or a dead letter
        captions = sum(len(caps) for _, (_, _, _, caps) in kept)
        assert len(kept) + captions + len(dead) == expected, dead
    fault_stats.add(invariant_checks=3)


# ---------------------------------------------------------------------------------------- VIST

vist_entries = st.fixed_dictionaries(
    {
        "photo_flickr_id": st.sampled_from(["1", "2", "3"]),
        "album_id": st.just("a"),
        "story_id": st.sampled_from(["s", "t"]),
        "photo_order_in_story": st.integers(0, 2),
        "text": st.text(max_size=8),
    },
)


@EXAMPLES
@given(
    raw=st.lists(
        st.lists(vist_entries, min_size=1, max_size=1) | json_values | st.just(DEEP), max_size=8
    ).flatmap(lambda anns: damaged({"images": [], "albums": [], "annotations": anns}))
)
def test_vist_annotation_files_keep_or_dead_letter_every_annotation(raw, fault_stats):
    from pipelines.sources.vist import ReadVistSplit

    fault_stats.add(inputs_fuzzed=1)
    name = "dii/train.description-in-isolation.json"
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "dii").mkdir()
        (Path(root) / name).write_bytes(raw)
        kept, dead = run_step(ReadVistSplit("story-dii", root, "images", None, "s", 2), "train")
    expected = oracle(raw, ("annotations",), ("annotations",))
    check_file(
        kept,
        dead,
        expected,
        {"malformed_split_file"},
        {"not_utf8", "malformed_annotation", "incomplete_story", "missing_image"},
        lambda d: d.source_id == name,
    )
    assert not kept  # no image folder: every story is missing its images, none is kept
    if expected is not None:
        per_annotation = [d for d in dead if d.source_id.startswith(f"{name}#")]
        assert len(per_annotation) <= expected  # the others were grouped into stories, dead-lettered
    fault_stats.add(invariant_checks=3)


# ------------------------------------------------------------------------------ hessel docs.json

hessel_docs = st.lists(st.lists(st.text(max_size=5), max_size=2) | json_values | st.just(DEEP), max_size=3)


@EXAMPLES
@given(
    raw=st.tuples(hessel_docs, hessel_docs, st.booleans()).flatmap(
        lambda t: damaged({"train": t[0], "meta": {"k": 1}, **({"test": t[1]} if t[2] else {})})
    )
)
def test_hessel_docs_json_keeps_or_dead_letters_every_document(raw, fault_stats):
    from pipelines.sources.hessel import SPLITS, ReadHesselDocs

    fault_stats.add(inputs_fuzzed=1)
    with written(raw, "docs.json") as (_, path):
        kept, dead = run_step(ReadHesselDocs(), path)
    expected = oracle(raw, SPLITS)
    read = check_file(
        kept, dead, expected, {"malformed_docs_json"}, {"not_utf8"}, lambda d: d.source_id == path
    )
    if expected is not None:
        assert read == expected
    fault_stats.add(invariant_checks=2)


# ------------------------------------------------------------------- GoodNews and news JSONL

news_articles = st.fixed_dictionaries(
    {
        "article": st.text(max_size=10) | st.just(DEEP),
        "headline": st.fixed_dictionaries({"main": st.text(max_size=6)}) | json_values,
        "images": st.dictionaries(st.sampled_from("0123"), st.text(max_size=6) | json_values, max_size=3)
        | json_values,
    },
    optional={"pub_date": st.sampled_from(["2015-01-02T00:00:00Z", "2015-13-40", ""]) | json_values},
)


GOODNEWS_ARTICLE = b'{"k": {"article": "TEXT", "headline": {"main": "h"}, "images": {"0": "cap"}}}'


@EXAMPLES
@example(raw=GOODNEWS_ARTICLE.replace(b"TEXT", b"x \\ud83d"))
@example(raw=GOODNEWS_ARTICLE.replace(b"TEXT", b"x \xff"))
# found by the fuzzer: an article id holding an escaped lone surrogate crashed the split's hash
@example(raw=b'{"\\ud800 udc00": {"article": "", "headline": {"main": ""}, "images": {"0": ""}}}')
@given(
    raw=st.dictionaries(st.text(max_size=6), news_articles | json_values | st.just(DEEP), max_size=4).flatmap(
        damaged
    )
)
def test_goodnews_file_keeps_or_dead_letters_every_article(raw, fault_stats):
    from pipelines.sources.goodnews import ParseGoodNews
    from pipelines.sources.news_jsonl import SplitRule

    fault_stats.add(inputs_fuzzed=1)
    with written(raw, "captioning_dataset.json") as (root, path):
        kept, dead = run_step(ParseGoodNews(root, "resized", SplitRule("ratio")), path)
    text = codecs.decode(raw, "utf-8", "surrogateescape").removeprefix("\ufeff")
    try:  # every member of the object is an article
        members = json.loads(text, object_pairs_hook=Pairs)
        expected = len(members) if isinstance(members, Pairs) and depth(members) <= MAX_DEPTH else None
    except (ValueError, RecursionError):
        expected = None
    check_file(
        kept,
        dead,
        expected,
        {"malformed_json"},
        {"malformed_record", "no_images", "no_image_uri", "no_text", "not_utf8"},
        lambda d: d.source_id == path,
    )
    assert all(isinstance(d, RawDocument) and d.image_uris and encodable(d) for d in kept)
    if expected is not None:  # an article yields a document per image, or at least one dead letter
        assert len(kept) + len(dead) >= expected
    fault_stats.add(invariant_checks=3)


NEWS_SURROGATE = (  # an escaped lone surrogate in the headline: kept documents must be encodable
    b'{"article_id": "a", "language": "en", "date": "2015-01-02", "split": "train", "headline": "x \\ud83d",'
    b' "images": [{"uri": "a.jpg", "caption": "c"}], "image_positions": [], "_id": "a"}'
)


@st.composite
def news_lines(draw) -> bytes:
    article = {
        "article_id": draw(st.text(max_size=5) | json_values),
        "language": "en",
        "date": draw(st.sampled_from(["2015-01-02", "x"]) | json_values),
        "headline": draw(st.text(max_size=6) | json_values | st.just(DEEP)),
        "images": draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "uri": st.sampled_from(["a.jpg", "", "../x.jpg"]) | json_values,
                        "caption": st.text(max_size=6) | json_values,
                    }
                )
                | json_values,
                max_size=2,
            )
            | json_values
        ),
        "split": draw(st.sampled_from(["train", "valid", "test", "other"]) | json_values),
        "image_positions": [],
        "_id": draw(st.text(max_size=4)),
        "parsed_section": draw(json_values),
        "DEEP": DEEP,
    }
    return draw(damaged(article)).replace(b"\n", b" ")


@EXAMPLES
@example(line=NEWS_SURROGATE)
@given(line=news_lines())
def test_news_and_nytimes800k_lines_become_documents_or_dead_letters(line, fault_stats):
    from functools import partial

    from pipelines.sources.news_jsonl import ParseArticleLines, SplitRule, parse_article
    from pipelines.sources.nytimes800k import parse_line

    fault_stats.add(inputs_fuzzed=1)
    reasons = {"not_utf8", "malformed_record", "language_filtered", "no_images", "no_image_uri", "no_text"}
    for parse, extra in (
        (partial(parse_article, root="/data", rule=SplitRule("ratio")), set()),
        (partial(parse_line, root="/data", images_dir="images", rule=SplitRule("ratio")), set()),
        (
            partial(parse_line, root="/data", images_dir="images", rule=SplitRule("release")),
            {"no_release_split"},
        ),
    ):
        kept, dead = run_step(ParseArticleLines(parse), line)
        assert {d.reason for d in dead} <= reasons | extra, dead
        assert all(isinstance(d, RawDocument) and encodable(d) for d in kept)
        assert kept or dead or not line.strip()  # a line is kept or dead-lettered, never dropped
        fault_stats.add(invariant_checks=2)


# ------------------------------------------------------------------- synthetic documents.jsonl


@st.composite
def synthetic_lines(draw) -> bytes:
    numbers = st.integers(-2, 5) | st.floats(allow_nan=True, allow_infinity=True) | json_values
    record = {
        "doc_id": draw(st.text(max_size=5) | json_values | st.just(DEEP)),
        "sentences": draw(st.lists(st.text(max_size=8), max_size=3) | json_values),
        "images": draw(
            st.lists(st.sampled_from(["img/a.png", "../b.png", "/abs/c.png"]), max_size=2) | json_values
        ),
        "links": draw(
            st.lists(st.lists(numbers, min_size=2, max_size=2) | json_values, max_size=3) | json_values
        ),
        "metadata": draw(st.dictionaries(st.text(max_size=4), json_values, max_size=3) | json_values),
        "split": draw(st.sampled_from(["train", "val", "test", "dev"]) | json_values),
        "DEEP": DEEP,
    }
    for key in draw(st.lists(st.sampled_from(sorted(record)), max_size=2, unique=True)):
        del record[key]
    return draw(damaged(record)).replace(b"\n", b" ")


@EXAMPLES
@example(line=b'{"doc_id": "d", "sentences": ["a"], "images": ["a.png"], "links": [[0, 1e400]]}')
@example(line=b'{"doc_id": "d", "sentences": ["a"], "images": ["a.png"], "links": [[Infinity, 0]]}')
@example(line=b'{"doc_id": "d\\ud800", "sentences": ["a"], "images": [], "metadata": {"k": "\\udc80"}}')
@given(line=synthetic_lines())
def test_synthetic_lines_become_documents_or_dead_letters(line, fault_stats):
    # Found by this test (its examples): a link index of 1e400 or Infinity (json reads both as
    # float inf) made int() raise OverflowError, which the step did not catch; an escaped lone
    # surrogate in the doc id or metadata reached Beam's coder and failed the whole build.
    from pipelines.sources.synthetic import SPLITS, ParseSyntheticLine

    fault_stats.add(inputs_fuzzed=1)
    kept, dead = run_step(ParseSyntheticLine("/corpus"), line)
    assert {d.reason for d in dead} <= {"not_utf8", "malformed_record"}, dead
    assert len(kept) + len(dead) == (1 if line.strip() else 0)  # a line is kept or dead-lettered
    for doc in kept:
        assert isinstance(doc, RawDocument) and isinstance(doc.doc_id, str) and encodable(doc)
        assert all(isinstance(s, str) for s in doc.sentences) and doc.split in (None, *SPLITS)
        assert all(isinstance(s, int) and isinstance(i, int) for s, i in doc.links or [])
    fault_stats.add(invariant_checks=2)
