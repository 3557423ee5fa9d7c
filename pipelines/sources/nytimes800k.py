"""NYTimes800k (Tran et al., "Transform and Tell", CVPR 2020) read into the news samples of
``schemas/news.py`` (issue #18; fields, splits and dead letters: docs/sources.md).

Why JSON Lines from ``mongoexport`` rather than the database: Beam splits a text file across
workers and the project carries no MongoDB client. Articles go through ``news_jsonl.py``'s parser;
``split=release`` so results compare with published ones."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import apache_beam as beam
from apache_beam import coders

from pipelines import fileio
from pipelines.records import RawDocument, dead_lettered
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec
from pipelines.sources.jsonstream import loads, repaired
from pipelines.sources.news_jsonl import ParseArticleLines, SplitRule, day_of, parse_record, split_rule
from schemas.errors import MmlinksError

SOURCE = "nytimes800k"
FILE = "articles.json"
RELEASE_SPLITS = {"train": "train", "valid": "val", "val": "val", "test": "test"}
SPLIT_MODES = ("release", "date", "ratio")


@dataclass(frozen=True)
class FixedSplit:
    """The release's own split of one article, in the shape of ``SplitRule`` for the parser."""

    value: str
    mode: str = "release"

    def split(self, article_id: str, date: str) -> str:
        return self.value


HASH = re.compile(r"[0-9a-fA-F]{8,128}")


def ext_id(value) -> str:
    """``"5a..."`` or extended JSON ``{"$oid": "5a..."}`` -> the id text."""
    if isinstance(value, dict):
        value = value.get("$oid", "")
    return "" if value is None or isinstance(value, dict | list) else str(value).strip()


def ext_date(value) -> str:
    """A pub_date as mongoexport writes it (relaxed or canonical extended JSON, or plain ISO
    text) -> ``YYYY-MM-DD``, or ``""`` when absent or unreadable (the split decides if it matters)."""
    if isinstance(value, dict):
        value = value.get("$date")
        if isinstance(value, dict):
            value = value.get("$numberLong")
        if isinstance(value, int | str) and str(value).lstrip("-").isdigit():
            try:
                ms = int(value)
                return (dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ms)).date().isoformat()
            except (OverflowError, ValueError):
                return ""
    try:
        return day_of(value) if isinstance(value, str) else ""
    except ValueError:
        return ""


def _text(value) -> str:
    if isinstance(value, dict):
        value = value.get("main") or value.get("print_headline") or ""
    return value.strip() if isinstance(value, str) else ""


def news_record(doc: dict, images_dir: str) -> dict:
    """One ``articles`` document -> an article in the news JSONL layout (uris relative to the input)."""
    sections = doc.get("parsed_section")
    sections = [s if isinstance(s, dict) else {} for s in sections] if isinstance(sections, list) else []
    positions = doc.get("image_positions")
    images = []
    for pos in positions if isinstance(positions, list) else []:
        entry = sections[pos] if isinstance(pos, int) and 0 <= pos < len(sections) else {}
        digest = _text(entry.get("hash"))
        if not HASH.fullmatch(digest):  # the release names images by hex digest: nothing else
            digest = ""  # becomes a path (a "../x" would leave the images folder): no_image_uri
        images.append(
            {"uri": f"{images_dir}/{digest}.jpg" if digest else "", "caption": _text(entry.get("text"))}
        )
    paragraphs = [_text(s.get("text")) for s in sections if s.get("type") == "paragraph"]
    lead = next(
        (_text(doc.get(k)) for k in ("abstract", "lead_paragraph", "snippet") if _text(doc.get(k))), ""
    )
    return {
        "article_id": ext_id(doc.get("_id")),
        "date": ext_date(doc.get("pub_date")),
        "language": "en",
        "headline": _text(doc.get("headline")),
        "lead": lead,
        "body": "\n".join(p for p in paragraphs if p),
        "images": images,
    }


def parse_line(
    line: str, root: str, images_dir: str, rule: SplitRule
) -> Iterator[RawDocument | tuple[str, str, str]]:
    """One exported line -> a RawDocument per image, or (source id, reason, detail) dead letters."""
    try:
        doc = repaired(loads(line))  # escaped lone surrogates: Beam's coder cannot encode them
    except ValueError as exc:
        yield (line[:80], "malformed_record", f"{type(exc).__name__}: {exc}")
        return
    if not isinstance(doc, dict):
        yield (line[:80], "malformed_record", "line is not a JSON object")
        return
    rec = news_record(doc, images_dir)
    if rule.mode == "release":
        split = RELEASE_SPLITS.get(doc.get("split")) if isinstance(doc.get("split"), str) else None
        if split is None:
            yield (rec["article_id"] or line[:80], "no_release_split", repr(doc.get("split"))[:80])
            return
        rule = FixedSplit(split)  # type: ignore[assignment]
    yield from parse_record(rec, root, rule, None, line[:80], SOURCE)


class ReadNYTimes800k(beam.PTransform):
    """The exported ``articles`` collection -> RawDocument (one per image), with a ``dead_letter`` output."""

    def __init__(self, ctx: SourceContext):
        super().__init__()
        self.path = _check(ctx)
        self.images_dir = ctx.str("images") or "images_processed"
        self.rule = split_rule(ctx, modes=SPLIT_MODES)
        self.root = ctx.input

    def expand(self, pbegin):
        return (
            pbegin
            | "Read" >> beam.io.ReadFromText(self.path, coder=coders.BytesCoder())
            | "Parse"
            >> dead_lettered(
                ParseArticleLines(
                    partial(parse_line, root=self.root, images_dir=self.images_dir, rule=self.rule), self.path
                )
            )
        )


def _check(ctx: SourceContext) -> str:
    path = fileio.join(ctx.input, ctx.str("articles") or FILE)
    if not fileio.exists(path):
        raise MmlinksError(
            f"nytimes800k input {ctx.input} has no {ctx.str('articles') or FILE} "
            "(mongoexport --db nytimes --collection articles --out articles.json)"
        )
    split_rule(ctx, modes=SPLIT_MODES)
    return path


SPEC = SourceSpec(
    name=SOURCE,
    summary="NYTimes800k (Transform and Tell): exported articles.json + images_processed/ -> news samples",
    make=ReadNYTimes800k,
    options=(
        SourceOption(
            "articles", FILE, "the articles collection as JSON Lines (mongoexport), under the input"
        ),
        SourceOption("images", "images_processed", "image folder under the input (<hash>.jpg)"),
        SourceOption("split", "release", "release (the dataset's split field), date or ratio"),
        SourceOption("val_from", None, "date split: first validation day"),
        SourceOption("test_from", None, "date split: first test day"),
        SourceOption("ratios", "0.8,0.1,0.1", "ratio split: train,val,test shares"),
    ),
    check=_check,  # its return value (the file's path) is ignored
)
