"""Fuzzing the table readers (issue #19): WIT's TSV files (plain or gzip), Clue's per-split CSVs
and CITE's ``|``-separated ``data.csv``, written the way the releases are (csv quoting, fields
holding the delimiter, quotes, tabs, newlines and carriage returns), then whole, cut, with a
flipped byte, a stray ``\\r`` or NUL, invalid UTF-8, or replaced by random bytes (WIT: also the
gzip stream cut or corrupted), read by the sources' own Beam steps.

Invariants: the step never raises and ends within ``BOUND_S`` seconds; every output is a record
or a dead letter with a kind and a reason from the reader's own list; a whole-file problem is
one dead letter for the file (after the rows before it); in a file the csv module (the oracle)
reads, every row is kept or dead-lettered; Clue's allowlist (``hosts_of``, built on the driver)
never raises and names the host of every kept document; WIT's page step turns each distinct image
of a page into exactly one document or dead letter. ``tests/faults/test_parser_fuzz.py`` and
``test_stream_fuzz.py`` fuzz the JSON readers the same way.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pipelines.records import RawDocument
from pipelines.sources.cite import COLUMNS as CITE_COLUMNS
from pipelines.sources.clue import COLUMNS as CLUE_COLUMNS
from tests.faults.conftest import FUZZ
from tests.faults.test_stream_fuzz import run_step, written

pytestmark = [pytest.mark.faults, pytest.mark.slow]
EXAMPLES = FUZZ  # 60 files per reader in the suite, 300 under benchmarks/faults.py

# Text that exercises csv quoting: delimiters, quotes, line breaks, a lone \r, NUL, non-ASCII.
# (No lone surrogates: a file holds bytes; invalid UTF-8 is inserted as bytes by damaged_table.)
cells = st.text(
    st.sampled_from(list('ab 1,|"\t\n\r\x00é')) | st.characters(exclude_categories=["Cs"]), max_size=12
)


@st.composite
def damaged_table(draw, rows: list[list[str]], delimiter: str) -> bytes:
    """``rows`` written by csv (the release's quoting), then whole, cut, with a byte replaced,
    a stray carriage return or NUL, an invalid UTF-8 sequence, or replaced by random bytes."""
    buf = io.StringIO()
    terminator = draw(st.sampled_from(["\n", "\r\n"]))
    csv.writer(buf, delimiter=delimiter, lineterminator=terminator).writerows(rows)
    raw = buf.getvalue().encode()
    mode = draw(st.sampled_from(["whole", "whole", "cut", "flip", "insert", "bytes"]))
    if mode == "bytes":
        return draw(st.binary(max_size=300))
    if mode == "whole" or not raw:
        return raw
    at = draw(st.integers(0, len(raw) - 1))
    if mode == "cut":
        return raw[:at]
    if mode == "flip":
        return raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    stray = draw(st.sampled_from([b"\r", b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80", b'"']))
    return raw[:at] + stray + raw[at:]


def table_oracle(raw: bytes, columns, delimiter: str) -> int | str:
    """The rows csv reads from ``raw`` decoded as the readers decode it, or the file's one
    reason: ``not_utf8``, ``bad_header`` (a column missing), ``malformed_csv`` (csv stops)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "not_utf8"
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        if any(c and c not in (reader.fieldnames or []) for c in columns):
            return "bad_header"
        return sum(1 for _ in reader)
    except csv.Error:
        return "malformed_csv"


def check_table(kept, dead, expected, path: str, row_reasons: set[str]) -> None:
    """A broken file: exactly one dead letter for it, last (after the rows before the fault);
    a readable one: no file letter, every row kept or dead-lettered."""
    file_letters = [d for d in dead if d.source_id == path]
    rows = [d for d in dead if d.source_id != path]
    assert {d.reason for d in rows} <= row_reasons, dead
    if isinstance(expected, str):
        assert [d.reason for d in file_letters] == [expected] and dead[-1] is file_letters[0], dead
        if expected != "malformed_csv":
            assert not kept and not rows  # refused before any row
    else:
        assert not file_letters, dead
        assert len(kept) + len(rows) == expected, dead


# ---------------------------------------------------------------------------------------- Clue

URLS = ["https://img.example.org/1.jpg", "http://Cdn.Example.org/a b.jpg", "ftp://x/y", "", "http://[::1",
        "http://a\uff03b/x.jpg", "https://", "//host/x.jpg"]  # fmt: skip
CLUE_HEADER = (",".join(CLUE_COLUMNS) + "\n").encode()
CITE_HEADER = ("|".join(CITE_COLUMNS) + "\n").encode()
LABELS = ["0", "1", "1.0", "true", "False", "", "2", " 1 "]


def table_rows(draw, columns, renamed: list[str], index: str, row_values) -> list[list[str]]:
    """A header (now and then one column missing or renamed to one of ``renamed``) and up to 5
    rows: every cell fuzzed, ``row_values(n)`` the strategies of the columns the reader reads,
    now and then a row cut short."""
    header = list(columns)
    if draw(st.integers(0, 5)) == 0:
        header[draw(st.integers(1, len(header) - 1))] = draw(st.sampled_from(renamed))
    rows = [header]
    for n in range(draw(st.integers(0, 5))):
        row = {c: draw(cells) for c in columns}
        row.update({"": str(n), index: draw(st.sampled_from([str(n), "7", ""]) | cells)})
        row.update({c: draw(strategy) for c, strategy in row_values().items()})
        fields = [row[c] for c in columns]
        rows.append(fields[: draw(st.integers(0, len(fields)))] if draw(st.integers(0, 6)) == 0 else fields)
    return rows


@st.composite
def clue_files(draw) -> bytes:
    from pipelines.sources.clue import COLUMNS, RELATIONS

    def values() -> dict:
        return {
            "caption": st.sampled_from(["a horse", " ", ""]) | cells,
            "url": st.sampled_from(URLS) | cells,
            **{r: st.sampled_from(LABELS) | cells for r in RELATIONS},
        }

    return draw(damaged_table(table_rows(draw, COLUMNS, ["", "caption ", "x"], "index", values), ","))


@EXAMPLES
@example(
    raw=CLUE_HEADER + b"0,1,cap,http://[x,1,0,0,0,0,0,,,,,\n0,2,a\rb,http://a.org/x.jpg,1,0,0,0,0,0,,,,,\n"
)
@given(raw=clue_files())
def test_clue_csv_files_keep_or_dead_letter_every_row(raw, fault_stats):
    # Found by this test: an unclosed IPv6 bracket in a URL (ValueError from urlsplit) and a
    # lone \r in a field (csv.Error) crashed both the parse step and hosts_of on the driver.
    from pipelines.sources.clue import COLUMNS, ParseClueFile, hosts_of, http_host

    fault_stats.add(inputs_fuzzed=1)
    with written(raw, "train.csv") as (_, path):
        kept, dead = run_step(ParseClueFile(), path)
        hosts = hosts_of(path)
    check_table(kept, dead, table_oracle(raw, COLUMNS, ","), path, {"no_caption", "bad_url", "bad_label"})
    assert all(isinstance(h, str) and h for h in hosts)
    for doc in kept:
        assert isinstance(doc, RawDocument) and doc.sentences[0].strip() and doc.links == [(0, 0)]
        assert http_host(doc.image_uris[0]) in hosts  # the allowlist lets it be fetched
    fault_stats.add(invariant_checks=3)


# ---------------------------------------------------------------------------------------- CITE

IMAGES = ["churros_1_0.jpg", "churros_2_0.jpg", "1.png", "../x.jpg", ".hidden.jpg", "a/b.jpg", "",
          "x\x00.jpg", "é" * 300 + ".jpg"]  # fmt: skip
ANSWERS = ["True", "False", "true", "0", "", "yes", " True "]


@st.composite
def cite_files(draw) -> bytes:
    from pipelines.sources.cite import COLUMNS, QUESTIONS

    def values() -> dict:
        return {
            "stim_txt": st.sampled_from(["Mix the flour&#160;well.", "&#160;", ""]) | cells,
            "qimg": st.sampled_from(IMAGES) | cells,
            **{q: st.sampled_from(ANSWERS) | cells for q in QUESTIONS},
        }

    return draw(damaged_table(table_rows(draw, COLUMNS, ["", "qimg ", "x"], "Index", values), "|"))


@EXAMPLES
@example(raw=CITE_HEADER + b"0|5||True|True|True|True|True|True|True|||a_1_0.jpg|s|Bake\rit.\n")
@given(raw=cite_files())
def test_cite_csv_files_keep_or_dead_letter_every_row(raw, fault_stats):
    # Found by this test (at 300 examples): a lone \r in an unquoted field (csv.Error).
    from pipelines.sources.cite import COLUMNS, ParseCiteFile

    fault_stats.add(inputs_fuzzed=1)
    with written(raw, "data.csv") as (root, path):
        images = Path(root) / "images"
        (images / "train" / "images-qa").mkdir(parents=True)
        (images / "train" / "images-qa" / "churros_1_0.jpg").write_bytes(b"jpeg")
        kept, dead = run_step(ParseCiteFile(str(images)), path)
    reasons = {"no_text", "bad_label", "bad_image_name", "image_not_in_recipeqa"}
    check_table(kept, dead, table_oracle(raw, COLUMNS, "|"), path, reasons)
    for doc in kept:
        assert isinstance(doc, RawDocument) and doc.sentences[0] and doc.links == [(0, 0)]
        assert doc.image_uris == [str(images / "train" / "images-qa" / "churros_1_0.jpg")]
    fault_stats.add(invariant_checks=2)


# ----------------------------------------------------------------------------------------- WIT

PAGES = ["https://de.wikipedia.org/wiki/Genfersee", "https://fr.wikipedia.org/wiki/L%C3%A9man", ""]
IMAGE_URLS = ["https://upload.wikimedia.org/a.jpg", "https://upload.wikimedia.org/b.jpg", "", "../c.jpg"]


@st.composite
def wit_rows(draw) -> list[list[str]]:
    from pipelines.sources.wit import COLUMNS

    rows = [list(COLUMNS)] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 6))):
        row = {c: draw(cells) for c in COLUMNS}
        row["language"] = draw(st.sampled_from(["de", "fr", "", "language"]) | cells)
        row["page_url"] = draw(st.sampled_from(PAGES) | cells)
        row["image_url"] = draw(st.sampled_from(IMAGE_URLS) | cells)
        row["mime_type"] = draw(st.sampled_from(["image/jpeg", "image/png", "image/svg+xml"]) | cells)
        for c in ("page_title", "context_page_description", "context_section_description"):
            row[c] = draw(st.sampled_from(["Der Genfersee", " ", ""]) | cells)
        fields = [row[c] for c in COLUMNS]
        rows.append(fields[: draw(st.integers(0, len(fields)))] if draw(st.integers(0, 6)) == 0 else fields)
    return rows


@st.composite
def wit_files(draw) -> tuple[str, bytes]:
    """(file name, bytes): a damaged TSV, or one gzipped whole, with its stream cut, a byte of
    it replaced, or trailing garbage."""
    raw = draw(wit_rows().flatmap(lambda rows: damaged_table(rows, "\t")))
    mode = draw(st.sampled_from(["tsv", "gz", "gz_cut", "gz_flip", "gz_trailing"]))
    if mode == "tsv":
        return "wit_v1.train.tsv", raw
    packed = gzip.compress(raw, mtime=0)
    at = draw(st.integers(0, len(packed) - 1))
    if mode == "gz_cut":
        packed = packed[:at]
    elif mode == "gz_flip":
        packed = packed[:at] + bytes([packed[at] ^ draw(st.integers(1, 255))]) + packed[at + 1 :]
    elif mode == "gz_trailing":
        packed += draw(st.binary(min_size=1, max_size=20))
    return f"wit_v1.train.{mode}.tsv.gz", packed


def wit_oracle(name: str, raw: bytes) -> int | None:
    """The data rows csv reads from a file that decompresses and decodes cleanly; None otherwise."""
    from pipelines.sources.csvtable import FIELD_LIMIT

    try:
        text = (gzip.decompress(raw) if name.endswith(".gz") else raw).decode("utf-8-sig")
        csv.field_size_limit(FIELD_LIMIT)
        rows = list(csv.reader(io.StringIO(text, newline=""), delimiter="\t"))
    except (OSError, EOFError, ValueError, csv.Error, zlib.error):  # BadGzipFile, decoding
        return None
    return len(rows) - (1 if rows and rows[0][:1] == ["language"] else 0)


@EXAMPLES
@example(file=("wit_v1.train.tsv", b"\t".join([b"de"] * 16 + [b"\xff"]) + b"\n"))
@example(file=("wit_v1.train.tsv.gz", gzip.compress(b"de\tx\n")[:-5]))
@example(file=("wit_v1.train.tsv.gz", b"not gzip"))
@given(file=wit_files())
def test_wit_files_keep_or_dead_letter_every_row_and_image(file, fault_stats):
    # Found by this test: a byte that is not UTF-8 (UnicodeDecodeError), a cut gzip stream
    # (EOFError) and a corrupt one (BadGzipFile, zlib.error) crashed the step with a traceback.
    from pipelines.sources.news_jsonl import SplitRule
    from pipelines.sources.wit import PageSamples, ParseWitFile

    name, raw = file
    fault_stats.add(inputs_fuzzed=1)
    with written(raw, name) as (_, path):
        kept, dead = run_step(ParseWitFile(None, frozenset({"image/jpeg", "image/png"})), path)
    file_letters = [d for d in dead if d.reason == "malformed_file"]
    assert {d.reason for d in dead} <= {"malformed_record", "not_utf8", "unsupported_mime", "malformed_file"}
    assert len(file_letters) <= 1 and (not file_letters or dead[-1] is file_letters[0]), dead
    expected = wit_oracle(name, raw)
    if expected is not None:  # a clean file: every row kept or dead-lettered, no file letter
        assert not file_letters and len(kept) + len(dead) == expected, dead
    pages = defaultdict(list)
    for key, row in kept:
        pages[key].append(row)
    for key, rows in pages.items():
        docs, page_dead = run_step(PageSamples(SplitRule("ratio")), (key, rows))
        assert {d.reason for d in page_dead} <= {"malformed_record", "no_image_uri", "no_text"}, page_dead
        assert all(isinstance(d, RawDocument) and d.image_uris and d.sentences for d in docs)
        assert len(docs) + len(page_dead) == len({r["image_url"] for r in rows})  # one per image
    fault_stats.add(invariant_checks=3)
