"""News articles in the mmlinks news JSONL layout (issue #18), what `mmlinks data synth-news`
writes and a newsroom's export can be written in (docs/sources.md, "News articles").

Each image is one sample. Why the split is per article: its samples share one, by date (default,
as a newsroom would: train on the past) or by a hash of ``article_id``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from urllib.parse import urlsplit

import apache_beam as beam
import numpy as np
from apache_beam import coders

from pipelines import fileio
from pipelines.records import DEAD_LETTER, LineLocator, RawDocument, count, dead_letter, dead_lettered
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec
from pipelines.sources.http_options import http_source_options, polite_fetcher
from pipelines.sources.jsonstream import loads, repaired
from pipelines.splits import assign_split
from schemas.errors import MmlinksError
from schemas.news import NEWS_SOURCES, SOURCES_KEY
from schemas.text import has_tokens

SOURCE = "news-jsonl"
SPLIT_MODES = ("date", "ratio")


@dataclass(frozen=True)
class SplitRule:
    """How an article gets its split: by date cut points or by a hash with ratios."""

    mode: str = "date"
    val_from: str = ""
    test_from: str = ""
    ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)

    def split(self, article_id: str, date: str) -> str:
        if self.mode == "ratio":
            return assign_split(article_id, dict(zip(("train", "val", "test"), self.ratios, strict=True)))
        if self.test_from and date >= self.test_from:
            return "test"
        return "val" if self.val_from and date >= self.val_from else "train"


def day_of(value) -> str:
    """'2020-03-01' or '2020-03-01T10:00:00Z' -> '2020-03-01'; ValueError otherwise."""
    return dt.date.fromisoformat(str(value)[:10]).isoformat()


def resolve_uri(root: str, uri: str) -> str:
    if urlsplit(uri).scheme in ("http", "https") or uri.startswith("/") or "://" in uri:
        return uri
    return fileio.join(root, uri)


def parse_article(
    line: str, root: str, rule: SplitRule, languages: frozenset[str] | None = None
) -> Iterator[RawDocument | tuple[str, str, str]]:
    """One JSONL line -> a RawDocument per image, or (source id, reason, detail) dead letters."""
    try:
        rec = repaired(loads(line))  # escaped lone surrogates: Beam's coder cannot encode them
    except ValueError as exc:
        yield (line[:80], "malformed_record", f"{type(exc).__name__}: {exc}")
        return
    yield from parse_record(rec, root, rule, languages, line[:80], SOURCE)


def parse_record(
    rec, root: str, rule: SplitRule, languages: frozenset[str] | None, where: str, source: str
) -> Iterator[RawDocument | tuple[str, str, str]]:
    """One article in the news layout (a dict) -> RawDocuments or dead letters (``where`` names
    it in a dead letter when it has no id); other news formats convert to this layout."""
    try:
        if not isinstance(rec, dict):
            raise ValueError("line is not a JSON object")
        article_id = str(rec["article_id"]).strip()
        # a ratio split does without dates (GoodNews records may carry none)
        date = day_of(rec["date"]) if rec.get("date") or rule.mode == "date" else ""
        language = str(rec["language"]).strip()
        images = rec.get("images") or []
        if not article_id or not language or not isinstance(images, list):
            raise ValueError("article_id and language must be non-empty, images a list")
    except (ValueError, KeyError, TypeError) as exc:
        yield (where, "malformed_record", f"{type(exc).__name__}: {exc}")
        return
    if languages is not None and language not in languages:
        yield (article_id, "language_filtered", language)
        return
    if not images:
        yield (article_id, "no_images", "")
        return
    split = rule.split(article_id, date)
    shared = {s: str(rec.get(s) or "") for s in NEWS_SOURCES[:3]}
    for k, im in enumerate(images):
        sid = f"{article_id}#{k}"
        uri = str(im.get("uri") or "").strip() if isinstance(im, dict) else ""
        if not uri:
            yield (sid, "no_image_uri", "")
            continue
        texts = {**shared, "caption": str(im.get("caption") or "")}
        present = [s for s in NEWS_SOURCES if has_tokens(texts[s])]
        if not present:
            yield (sid, "no_text", "")
            continue
        meta = {SOURCES_KEY: ",".join(present), "language": language, "date": date, "article_id": article_id}
        if rec.get("outlet"):
            meta["outlet"] = str(rec["outlet"])
        yield RawDocument(
            doc_id=sid,
            source=source,
            sentences=[texts[s] for s in present],
            image_uris=[resolve_uri(root, uri)],
            links=[(j, 0) for j in range(len(present))],
            metadata=meta,
            split=split,
        )


class ParseArticleLines(beam.DoFn):
    """Lines of an article export -> RawDocuments, bad records as dead letters with their reason.

    ``parse`` turns one decoded line into RawDocuments and (source id, reason, detail) tuples:
    ``parse_article`` here, a format's own reader elsewhere (``nytimes800k.parse_line``)."""

    def __init__(
        self, parse: Callable[[str], Iterable[RawDocument | tuple[str, str, str]]], path: str | None = None
    ):
        self.parse = parse
        # the file read: a bad line's dead letter is named PATH:N (else by its first 80 characters)
        self.where = LineLocator(path) if path else None

    def process(self, raw: bytes):
        if not raw.strip():
            return
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            start = raw[:80].decode("utf-8", "replace")
            where = self.where(raw) if self.where else start
            yield dead_letter("line", where, "not_utf8", f"{exc}; the line starts {start!r}")
            return
        count("articles_in")
        for item in self.parse(line):
            if isinstance(item, RawDocument):
                count("documents_in")
                yield item
            elif item[1] == "malformed_record":
                where, reason, detail = item
                if self.where is not None:
                    where, detail = self.where(raw), f"{detail}; the line starts {line[:80]!r}"
                yield dead_letter("line", where, reason, detail)
            else:
                yield dead_letter("document", *item)


def _lines(path: str) -> Iterator[str]:
    yield from fileio.read_text(path).splitlines()


def date_cut_points(files: list[str]) -> tuple[str, str]:
    """The dates at the 80 % and 90 % quantiles of the articles (the default date split)."""
    days = []
    for path in files:
        for line in _lines(path):
            try:
                days.append(day_of(loads(line)["date"]))
            except (ValueError, KeyError, TypeError):
                continue  # the parse dead-letters it
    if not days:
        raise MmlinksError("no article of the news input has a readable date")
    ordinal = np.sort([dt.date.fromisoformat(d).toordinal() for d in days])
    val, test = (dt.date.fromordinal(int(np.quantile(ordinal, q, method="higher"))) for q in (0.8, 0.9))
    return val.isoformat(), test.isoformat()


def ratio_rule(ctx: SourceContext) -> SplitRule:
    """The ratio split of ``--source-option ratios=train,val,test`` (by article or page id)."""
    try:
        ratios = tuple(float(x) for x in (ctx.str("ratios") or "").split(","))
        if len(ratios) != 3 or min(ratios) < 0 or sum(ratios) <= 0:
            raise ValueError
    except ValueError:
        raise MmlinksError("--source-option ratios wants train,val,test, e.g. 0.8,0.1,0.1") from None
    return SplitRule("ratio", ratios=ratios)  # type: ignore[arg-type]


def split_rule(ctx: SourceContext, files: list[str] | None = None, modes=SPLIT_MODES) -> SplitRule:
    """The split a news source's options ask for, ``modes[0]`` by default. ``date`` without
    ``val_from`` and ``test_from`` cuts at the 80 % / 90 % quantiles of ``files``' dates where the
    source can read them up front (``files``), and is refused where it cannot."""
    mode = ctx.str("split") or modes[0]
    if mode not in modes:
        raise MmlinksError(f"--source-option split wants one of {', '.join(modes)}, not {mode!r}")
    if mode in ("ratio", "release"):
        return ratio_rule(ctx) if mode == "ratio" else SplitRule("release")
    val_from, test_from = ctx.str("val_from") or "", ctx.str("test_from") or ""
    try:
        val_from, test_from = (day_of(d) if d else "" for d in (val_from, test_from))
    except ValueError:
        raise MmlinksError("--source-option val_from / test_from want YYYY-MM-DD dates") from None
    if files is None and not (val_from and test_from):
        raise MmlinksError(f"{ctx.source} split=date needs val_from and test_from (YYYY-MM-DD)")
    if not val_from and not test_from:
        val_from, test_from = date_cut_points(files or [])
    if val_from and test_from and test_from < val_from:
        raise MmlinksError("--source-option test_from must not be before val_from")
    return SplitRule("date", val_from, test_from)


def languages_of(ctx: SourceContext) -> frozenset[str] | None:
    text = (ctx.str("languages") or "").strip()
    return frozenset(x.strip() for x in text.split(",") if x.strip()) or None


class ReadNewsJsonl(beam.PTransform):
    """The JSONL files -> RawDocument (one per article image), with a ``dead_letter`` output."""

    def __init__(self, ctx: SourceContext):
        super().__init__()
        self.files = fileio.input_files(ctx.input, ".jsonl")
        if not self.files:
            raise MmlinksError(f"news input {ctx.input} holds no .jsonl file (the news JSONL layout)")
        self.rule = split_rule(ctx, self.files)
        self.languages = languages_of(ctx)

    def expand(self, pbegin):
        outs = []
        for n, path in enumerate(self.files):
            root = path.rsplit("/", 1)[0] if "/" in path else "."
            outs.append(
                pbegin
                | f"Read{n}" >> beam.io.ReadFromText(path, coder=coders.BytesCoder())
                | f"Parse{n}"
                >> dead_lettered(
                    ParseArticleLines(
                        partial(parse_article, root=root, rule=self.rule, languages=self.languages), path
                    )
                )
            )
        return {
            "documents": [o.documents for o in outs] | "Documents" >> beam.Flatten(),
            DEAD_LETTER: [o[DEAD_LETTER] for o in outs] | "DeadLetters" >> beam.Flatten(),
        }


def hosts_of(input_uri: str) -> set[str]:
    hosts = set()
    for path in fileio.input_files(input_uri, ".jsonl"):
        for line in _lines(path):
            try:
                images = loads(line).get("images") or []
            except (ValueError, AttributeError):
                continue
            for im in images:
                url = urlsplit(str((im or {}).get("uri") or "")) if isinstance(im, dict) else None
                if url is not None and url.scheme in ("http", "https") and url.netloc:
                    hosts.add(url.netloc.lower())
    return hosts


def _fetcher(ctx: SourceContext):
    hosts = hosts_of(ctx.input)
    if not hosts:
        return None  # local files only: the image store reads them by scheme
    return polite_fetcher(ctx, hosts)


def _check(ctx: SourceContext) -> None:
    files = fileio.input_files(ctx.input, ".jsonl")
    if not files:
        raise MmlinksError(f"news input {ctx.input} holds no .jsonl file (the news JSONL layout)")
    split_rule(ctx, files)


OPTIONS = (
    SourceOption("split", "date", "date: train on the past, test on the future; ratio: by article id hash"),
    SourceOption("val_from", None, "date split: first validation day (default: the 80 % date quantile)"),
    SourceOption("test_from", None, "date split: first test day (default: the 90 % date quantile)"),
    SourceOption("ratios", "0.8,0.1,0.1", "ratio split: train,val,test shares"),
    SourceOption("languages", None, "keep only these language codes, comma-separated (default: all)"),
    *http_source_options(),
)

SPEC = SourceSpec(
    name=SOURCE,
    summary="news articles in the mmlinks news JSONL layout (headline, lead, body, captioned images)",
    make=ReadNewsJsonl,
    options=OPTIONS,
    fetcher=_fetcher,
    check=_check,
)
