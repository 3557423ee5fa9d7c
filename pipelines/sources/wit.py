"""WIT (Srinivasan et al., SIGIR 2021) read into the news samples of ``schemas/news.py``
(issue #18): a public multilingual source (columns and mapping: docs/sources.md).

Rows stream through the csv module (fields may hold tabs and newlines). Why pages are grouped by
(language, page_url): all images of a page share one split; WIT has no dates, so the split is by
a hash of the article id."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import io
import zlib
from collections.abc import Iterator

import apache_beam as beam

from pipelines import fileio
from pipelines.records import DEAD_LETTER, RawDocument, count, dead_letter, dead_lettered, documents_in
from pipelines.sources import csvtable
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec
from pipelines.sources.http_options import http_source_options, polite_fetcher
from pipelines.sources.jsonstream import has_invalid_utf8
from pipelines.sources.news_jsonl import SplitRule, parse_record, ratio_rule
from schemas.errors import MmlinksError

SOURCE = "wit"
COLUMNS = (
    "language",
    "page_url",
    "image_url",
    "page_title",
    "section_title",
    "hierarchical_section_title",
    "caption_reference_description",
    "caption_attribution_description",
    "caption_alt_text_description",
    "mime_type",
    "original_height",
    "original_width",
    "is_main_image",
    "attribution_passes_lang_id",
    "page_changed_recently",
    "context_page_description",
    "context_section_description",
)


def rows_of(path: str) -> Iterator[list[str]]:
    """The rows of one WIT file (gzip by its name), header row included. Bytes that are not
    UTF-8 become lone surrogates (``surrogateescape``) so one bad byte costs its row, not the
    file (``ParseWitFile`` dead-letters the row); a leading BOM is dropped."""
    csv.field_size_limit(csvtable.FIELD_LIMIT)
    with fileio.open_read(path) as raw:
        fh = gzip.open(raw) if path.endswith(".gz") else raw
        text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="surrogateescape", newline="")
        yield from csv.reader(text, delimiter="\t")


def page_key(row: dict) -> str:
    digest = hashlib.sha1(row["page_url"].encode()).hexdigest()[:12]
    return f"wit-{row['language']}-{digest}"


def article_samples(
    article_id: str, rows: list[dict], rule: SplitRule
) -> Iterator[RawDocument | tuple[str, str, str]]:
    """The rows of one page -> one sample per distinct image (the news parser, per image: the
    body is the image's own section text)."""
    seen: set[str] = set()
    for row in sorted(rows, key=lambda r: r["image_url"]):
        if row["image_url"] in seen:
            continue
        k = len(seen)
        seen.add(row["image_url"])
        rec = {
            "article_id": article_id,
            "language": row["language"],
            "headline": row["page_title"],
            "lead": row["context_page_description"],
            "body": row["context_section_description"],
            "images": [{"uri": row["image_url"], "caption": row["caption_reference_description"]}],
        }
        for item in parse_record(rec, "", rule, None, article_id, SOURCE):
            if isinstance(item, RawDocument):
                yield dataclasses.replace(item, doc_id=f"{article_id}#{k}")
            else:
                yield (f"{article_id}#{k}", item[1], item[2])


class ParseWitFile(beam.DoFn):
    """A WIT file -> (article id, row dict) per kept row, dead letters for the others."""

    def __init__(self, languages: frozenset[str] | None, mime_types: frozenset[str]):
        self.languages, self.mime_types = languages, mime_types

    def process(self, path: str):
        name = path.rsplit("/", 1)[-1]
        n = -1
        try:
            for n, fields in enumerate(rows_of(path)):
                yield from self._row(n, fields, f"{name}:{n}")
        except (csv.Error, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            # a corrupt or cut gzip stream, a field over csvtable.FIELD_LIMIT: the file ends here
            yield dead_letter("line", f"{name}:{n + 1}", "malformed_file", f"{type(exc).__name__}: {exc}")

    def _row(self, n: int, fields: list[str], where: str):
        if n == 0 and fields[:1] == ["language"]:
            return  # the release's header row
        if len(fields) != len(COLUMNS):
            yield dead_letter("line", where, "malformed_record", f"{len(fields)} fields, not {len(COLUMNS)}")
            return
        if has_invalid_utf8(fields):
            yield dead_letter("line", where, "not_utf8", "the row holds non-UTF-8 bytes")
            return
        row = dict(zip(COLUMNS, fields, strict=True))
        count("rows_in")
        if self.languages is not None and row["language"] not in self.languages:
            yield dead_letter("document", where, "language_filtered", row["language"])
        elif row["mime_type"] not in self.mime_types:
            yield dead_letter("document", where, "unsupported_mime", row["mime_type"])
        else:
            yield page_key(row), row


class PageSamples(beam.DoFn):
    def __init__(self, rule: SplitRule):
        self.rule = rule

    def process(self, keyed):
        article_id, rows = keyed
        count("articles_in")
        yield from documents_in(article_samples(article_id, list(rows), self.rule))


class ReadWit(beam.PTransform):
    """WIT TSV files -> RawDocument (one per page image), with a ``dead_letter`` output."""

    def __init__(self, ctx: SourceContext):
        super().__init__()
        self.files = _check(ctx)
        self.rule = _rule(ctx)
        text = (ctx.str("languages") or "").strip()
        self.languages = frozenset(x.strip() for x in text.split(",") if x.strip()) or None
        self.mime_types = frozenset(x.strip() for x in (ctx.str("mime_types") or "").split(",") if x.strip())

    def expand(self, pbegin):
        rows = (
            pbegin
            | "Files" >> beam.Create(self.files)
            | "Rows" >> dead_lettered(ParseWitFile(self.languages, self.mime_types), "rows")
        )
        samples = (
            rows.rows | "ByPage" >> beam.GroupByKey() | "Samples" >> dead_lettered(PageSamples(self.rule))
        )
        dead = (rows[DEAD_LETTER], samples[DEAD_LETTER]) | "DeadLetters" >> beam.Flatten()
        return {"documents": samples.documents, DEAD_LETTER: dead}


def _rule(ctx: SourceContext) -> SplitRule:
    if (ctx.str("split") or "ratio") != "ratio":
        raise MmlinksError("wit rows carry no date: --source-option split=ratio (by page) only")
    return ratio_rule(ctx)


def _check(ctx: SourceContext) -> list[str]:
    files = fileio.input_files(ctx.input, ".tsv", ".tsv.gz")
    if not files:
        raise MmlinksError(f"wit input {ctx.input} holds no .tsv or .tsv.gz file (the WIT release)")
    _rule(ctx)
    return files


def _fetcher(ctx: SourceContext):
    return polite_fetcher(ctx, {h.strip().lower() for h in (ctx.str("hosts") or "").split(",") if h.strip()})


SPEC = SourceSpec(
    name=SOURCE,
    summary="WIT (Wikipedia-based Image Text, 108 languages): wit_v1 TSV files -> news samples "
    "(page title, page description, section text, reference caption)",
    make=ReadWit,
    options=(
        SourceOption("split", "ratio", "ratio only (WIT has no dates): by page, with ratios"),
        SourceOption("ratios", "0.8,0.1,0.1", "train,val,test shares"),
        SourceOption("languages", None, "keep only these language codes, comma-separated (default: all)"),
        SourceOption(
            "mime_types", "image/jpeg,image/png", "image types kept (the release also lists SVG, GIF)"
        ),
        SourceOption("hosts", "upload.wikimedia.org", "hosts images may be fetched from, comma-separated"),
        *http_source_options(),
    ),
    fetcher=_fetcher,
    check=_check,
)
