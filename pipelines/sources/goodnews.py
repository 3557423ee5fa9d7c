"""GoodNews (Biten et al., CVPR 2019): New York Times articles with captioned images, read into
the news samples of ``schemas/news.py`` (issue #18; docs/sources.md).

``captioning_dataset.json`` is streamed (``jsonstream``) and each member goes through
``news_jsonl.py``'s parser. Checked on ``tests/fixtures/goodnews/``, not the full release."""

from __future__ import annotations

import apache_beam as beam

from pipelines import fileio
from pipelines.records import count, dead_letter, dead_lettered, documents_in
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec
from pipelines.sources.jsonstream import (
    MalformedJson,
    has_invalid_utf8,
    repaired,
    stream_members,
    text_chunks,
)
from pipelines.sources.news_jsonl import SplitRule, parse_record, split_rule
from schemas.errors import MmlinksError

SOURCE = "goodnews"
FILE = "captioning_dataset.json"
SPLIT_MODES = ("ratio", "date")


def _text(value) -> str:
    if isinstance(value, dict):
        value = value.get("main") or value.get("print_headline") or ""
    return str(value or "")


def news_record(key: str, value, images_dir: str) -> dict:
    """One GoodNews member -> an article in the news JSONL layout (uris relative to the input)."""
    if not isinstance(value, dict):
        return {"article_id": key}  # the parser dead-letters it as malformed
    images = value.get("images") if isinstance(value.get("images"), dict) else {}
    return {
        "article_id": key,
        "date": str(value.get("pub_date") or "")[:10],
        "language": "en",
        "headline": _text(value.get("headline")),
        "lead": _text(value.get("abstract") or value.get("lead_paragraph")),
        "body": _text(value.get("article")),
        "images": [
            {"uri": f"{images_dir}/{key}_{ix}.jpg", "caption": _text(cap)}
            for ix, cap in sorted(images.items(), key=lambda kv: (len(kv[0]), kv[0]))
        ],
    }


class ParseGoodNews(beam.DoFn):
    def __init__(self, root: str, images_dir: str, rule: SplitRule):
        self.root, self.images_dir, self.rule = root, images_dir, rule

    def process(self, path: str):
        try:
            with fileio.open_read(path) as fh:
                for key, value in stream_members(text_chunks(fh)):
                    count("articles_in")
                    if has_invalid_utf8(key) or has_invalid_utf8(value):  # bytes that are not UTF-8
                        shown = key.encode("utf-8", "surrogateescape").decode("utf-8", "replace")[:80]
                        yield dead_letter("document", shown, "not_utf8", "the article holds non-UTF-8 bytes")
                        continue
                    # escaped lone surrogates ("\ud83d" in the JSON): Beam's coder cannot encode them
                    key, value = repaired(key), repaired(value)
                    rec = news_record(key, value, self.images_dir)
                    yield from documents_in(parse_record(rec, self.root, self.rule, None, key, SOURCE))
        except MalformedJson as exc:
            yield dead_letter("line", path, "malformed_json", str(exc))


class ReadGoodNews(beam.PTransform):
    def __init__(self, ctx: SourceContext):
        super().__init__()
        self.path = _check(ctx)
        self.images_dir = ctx.str("images") or "resized"
        self.rule = split_rule(ctx, modes=SPLIT_MODES)
        self.root = ctx.input

    def expand(self, pbegin):
        return (
            pbegin
            | "File" >> beam.Create([self.path])
            | "Parse" >> dead_lettered(ParseGoodNews(self.root, self.images_dir, self.rule))
        )


def _check(ctx: SourceContext) -> str:
    path = fileio.join(ctx.input, FILE)
    if not fileio.exists(path):
        raise MmlinksError(f"goodnews input {ctx.input} has no {FILE} (the released GoodNews folder)")
    split_rule(ctx, modes=SPLIT_MODES)
    return path


SPEC = SourceSpec(
    name=SOURCE,
    summary="GoodNews (NYT articles + captioned images): captioning_dataset.json + resized/ -> news samples",
    make=ReadGoodNews,
    options=(
        SourceOption("images", "resized", "image folder under the input (<id>_<index>.jpg)"),
        SourceOption("split", "ratio", "ratio (by article id) or date (needs pub_date)"),
        SourceOption("val_from", None, "date split: first validation day"),
        SourceOption("test_from", None, "date split: first test day"),
        SourceOption("ratios", "0.8,0.1,0.1", "ratio split: train,val,test shares"),
    ),
    check=_check,  # its return value (the file's path) is ignored
)
