"""Clue (Alikhani et al. 2020): Conceptual Captions pairs labelled with coherence relations, the
retrieval family's real dataset (issue #17; docs/sources.md).

Why the allowlist is the CSV files' hosts: images come through the polite client and redirects
cannot leave it. A file named ``test`` (``val``) is that split; 10 % of train becomes validation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath
from urllib.parse import urlsplit

import apache_beam as beam

from pipelines import fileio
from pipelines.records import RawDocument, dead_letter, dead_lettered, documents_in
from pipelines.sources.base import SourceContext, SourceSpec
from pipelines.sources.csvtable import csv_rows
from pipelines.sources.http_options import http_source_options, policy_from_context, polite_fetcher
from schemas.errors import MmlinksError

SOURCE = "clue"
RELATIONS = ("Visible", "Subjective", "Action", "Story", "Meta", "Irrelevant")
EXTRA = ("Other", "When", "How", "Where", "Comment")
COLUMNS = ("", "index", "caption", "url", *RELATIONS, *EXTRA)
TRUE, FALSE = {"1", "1.0", "true", "True"}, {"0", "0.0", "false", "False"}


def split_of(name: str) -> str | None:
    stem = PurePosixPath(name).stem.lower()
    return "test" if "test" in stem else "val" if "val" in stem else None


def http_host(url: str) -> str | None:
    """The lower-cased host of an http(s) URL; None for anything else, including what ``urlsplit``
    refuses (an unclosed ``[`` IPv6 bracket, a host with characters NFKC turns into ``#``/``/``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return parts.netloc.lower() if parts.scheme in ("http", "https") and parts.netloc else None


def parse_clue_csv(text: str, name: str) -> Iterator[RawDocument | tuple[str, str, str]]:
    """RawDocuments, or (source id, reason, detail) for each row that cannot be one."""
    stem, split = PurePosixPath(name).stem, split_of(name)
    for n, row in enumerate(csv_rows(text, name, COLUMNS)):
        if isinstance(row, tuple):
            yield row
            return
        sid = f"{stem}:{row.get('index') or n}"
        caption, url = (row.get("caption") or "").strip(), (row.get("url") or "").strip()
        if not caption:
            yield (sid, "no_caption", "")
            continue
        if http_host(url) is None:
            yield (sid, "bad_url", url[:200])
            continue
        values = {r: (row.get(r) or "").strip() for r in RELATIONS}
        bad = {r: v for r, v in values.items() if v not in TRUE | FALSE}
        if bad:
            yield (sid, "bad_label", str(bad)[:200])
            continue
        meta = {"relations": ",".join(r for r in RELATIONS if values[r] in TRUE), "clue_file": stem}
        meta.update({f"clue_{c.lower()}": row[c].strip() for c in EXTRA if (row.get(c) or "").strip()})
        yield RawDocument(
            doc_id=f"clue-{stem}-{row.get('index') or n}",
            source=SOURCE,
            sentences=[caption],
            image_uris=[url],
            links=[(0, 0)],
            metadata=meta,
            split=split,
        )


def hosts_of(input_uri: str) -> set[str]:
    """The hosts of the URLs the CSV files name (the fetcher's allowlist). Built on the driver
    before the pipeline runs, so a file or row it cannot read is skipped here, not raised: the
    parse step dead-letters it with its reason."""
    hosts = set()
    for path in fileio.input_files(input_uri, ".csv"):
        try:
            text = fileio.read_text(path)
        except UnicodeDecodeError:
            continue
        for row in csv_rows(text, path, COLUMNS):
            host = http_host((row.get("url") or "").strip()) if isinstance(row, dict) else None
            if host:
                hosts.add(host)
    return hosts


class ParseClueFile(beam.DoFn):
    def process(self, path: str):
        try:
            text = fileio.read_text(path)
        except UnicodeDecodeError as exc:
            yield dead_letter("line", path, "not_utf8", str(exc))
            return
        yield from documents_in(parse_clue_csv(text, path), "line")


class ReadClue(beam.PTransform):
    """The CSV files -> RawDocument, with a ``dead_letter`` tagged output."""

    def __init__(self, input_uri: str):
        super().__init__()
        self.files = fileio.input_files(input_uri, ".csv")

    def expand(self, pbegin):
        return pbegin | "Files" >> beam.Create(self.files) | "Parse" >> dead_lettered(ParseClueFile())


def _check(ctx: SourceContext) -> None:
    if not fileio.input_files(ctx.input, ".csv"):
        raise MmlinksError(f"clue input {ctx.input} holds no CSV file (one per split, as released)")
    policy_from_context(ctx, {"example.org"})  # the politeness options, with clear errors


SPEC = SourceSpec(
    name=SOURCE,
    summary="Clue (Alikhani et al. 2020): captions + Conceptual Captions image URLs with coherence relations",
    make=lambda ctx: ReadClue(ctx.input),
    options=http_source_options(),
    build_defaults={"split_ratios": {"train": 0.9, "val": 0.1}},
    fetcher=lambda ctx: polite_fetcher(ctx, hosts_of(ctx.input)),
    check=_check,
    relations=lambda ctx: list(RELATIONS),
)
