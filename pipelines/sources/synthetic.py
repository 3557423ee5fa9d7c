"""Reads the synthetic corpus (``pipelines.synthetic_corpus``) as RawDocuments; malformed lines
are dead letters. A record's own ``split`` (``synth-coherence --split-sizes``) is kept."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
from apache_beam import coders
from apache_beam.io.filesystems import FileSystems

from pipelines.records import LineLocator, RawDocument, count, dead_letter, dead_lettered
from pipelines.sources.base import SourceContext, SourceSpec
from pipelines.sources.jsonstream import loads, repaired
from schemas.errors import MmlinksError

SOURCE = "synthetic"
SPLITS = ("train", "val", "test")


CORPUS_FILE = "documents.jsonl"


class ParseSyntheticLine(beam.DoFn):
    def __init__(self, root: str):
        self.root = root
        self.where = LineLocator(FileSystems.join(root, CORPUS_FILE))  # a bad line's PATH:N

    def process(self, raw: bytes):
        if not raw.strip():
            return
        count("lines_in")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            start = raw[:80].decode("utf-8", "replace")
            yield dead_letter("line", self.where(raw), "not_utf8", f"{exc}; the line starts {start!r}")
            return
        try:
            rec = repaired(loads(line))  # escaped lone surrogates: Beam's coder cannot encode them
            if not isinstance(rec, dict):
                raise ValueError("line is not a JSON object")
            doc_id = str(rec["doc_id"])
            sentences = rec["sentences"]
            images = rec["images"]
            if not isinstance(sentences, list) or not isinstance(images, list):
                raise ValueError("sentences and images must be lists")
            links = rec.get("links")
            links = None if links is None else [(int(s), int(i)) for s, i in links]
            metadata = rec.get("metadata") or {}
            if not isinstance(metadata, dict):
                raise ValueError("metadata must be an object")
            split = rec.get("split")
            if split is not None and split not in SPLITS:
                raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
        except (ValueError, KeyError, TypeError, OverflowError) as exc:  # Overflow: int(inf), a link 1e400
            detail = f"{type(exc).__name__}: {exc}; the line starts {line[:80]!r}"
            yield dead_letter("line", self.where(raw), "malformed_record", detail)
            return
        count("documents_in")
        yield RawDocument(
            doc_id=doc_id,
            source=SOURCE,
            sentences=[str(s) for s in sentences],
            image_uris=[FileSystems.join(self.root, str(p)) for p in images],
            links=links,
            metadata={str(k): str(v) for k, v in metadata.items()},
            split=split,
        )


class ReadSyntheticCorpus(beam.PTransform):
    """``DIR/documents.jsonl`` -> RawDocument, with a ``dead_letter`` tagged output."""

    def __init__(self, input_dir: str):
        super().__init__()
        self.input_dir = str(input_dir)
        if not Path(self.input_dir, "documents.jsonl").exists() and "://" not in self.input_dir:
            raise MmlinksError(f"{self.input_dir} is not a synthetic corpus (no documents.jsonl)")

    def expand(self, pbegin):
        return (
            pbegin
            # Bytes, not str: one non-UTF-8 line must become a dead letter, not fail the read.
            | "ReadLines"
            >> beam.io.ReadFromText(FileSystems.join(self.input_dir, CORPUS_FILE), coder=coders.BytesCoder())
            | "Parse" >> dead_lettered(ParseSyntheticLine(self.input_dir))
        )


def _check(ctx: SourceContext) -> None:
    ReadSyntheticCorpus(ctx.input)


def corpus_relations(ctx: SourceContext) -> list[str] | None:
    """The relation vocabulary of a synthetic coherence corpus (``corpus.json["relations"]``;
    pipelines/coherence_corpus.py); None for the link corpus."""
    path = FileSystems.join(ctx.input, "corpus.json")
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path) as fh:
        try:
            meta = loads(fh.read().decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:  # ValueError: MalformedJson, too deep or long
            raise MmlinksError(f"{path} is not JSON: {exc}") from exc
    relations = meta.get("relations") if isinstance(meta, dict) else None
    return None if relations is None else [str(r) for r in relations]


SPEC = SourceSpec(
    name=SOURCE,
    summary="the synthetic corpus of `mmlinks data synth` (DIR/documents.jsonl + images)",
    make=lambda ctx: ReadSyntheticCorpus(ctx.input),
    check=_check,
    relations=corpus_relations,
)
