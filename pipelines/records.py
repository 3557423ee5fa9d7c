"""Records that flow between pipeline stages, and dead-letter records."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import apache_beam as beam

DEAD_LETTER = "dead_letter"
DROPPED_NAMESPACE = "mmlinks.dropped"
COUNTS_NAMESPACE = "mmlinks.counts"


@dataclass
class RawDocument:
    """A source's document before validation; ``image_uris`` are readable by Beam FileSystems."""

    doc_id: str
    source: str
    sentences: list[str]
    image_uris: list[str]
    links: list[tuple[int, int]] | None
    metadata: dict[str, str] = field(default_factory=dict)
    split: str | None = None  # set when the source defines its own splits


@dataclass
class DeadLetter:
    kind: str  # line | document | image | sentence
    source_id: str  # doc id, "doc_id#image-k", or the start of an unparseable line
    reason: str
    detail: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def dead_letter(kind: str, source_id: str, reason: str, detail: str = "") -> beam.pvalue.TaggedOutput:
    """Count the drop under ``kind:reason`` and route the record to the dead-letter output."""
    beam.metrics.Metrics.counter(DROPPED_NAMESPACE, f"{kind}:{reason}").inc()
    return beam.pvalue.TaggedOutput(DEAD_LETTER, DeadLetter(kind, source_id, reason, detail[:500]))


def dead_lettered(dofn: beam.DoFn, main: str = "documents") -> beam.ParDo:
    """``dofn`` as a step whose records go to ``main`` and whose dead letters to ``DEAD_LETTER``."""
    return beam.ParDo(dofn).with_outputs(DEAD_LETTER, main=main)


def count(name: str, n: int = 1) -> None:
    beam.metrics.Metrics.counter(COUNTS_NAMESPACE, name).inc(n)


def documents_in(items, kind: str = "document"):
    """A parser's output as step output: RawDocuments counted as ``documents_in``, (source id,
    reason, detail) tuples as dead letters of ``kind``."""
    for item in items:
        if isinstance(item, RawDocument):
            count("documents_in")
            yield item
        else:
            yield dead_letter(kind, *item)


class LineLocator:
    """Names a bad line of a text file for its dead letter: ``PATH:N``, the line's number looked
    up in the file (``fileio.line_number``: Beam's text reads give none), for at most ``lookups``
    bad lines per worker (each is one pass over the file), then ``PATH`` alone. Picklable: each
    worker counts its own look-ups."""

    def __init__(self, path: str, lookups: int = 100):
        self.path, self.left = path, lookups

    def __call__(self, raw: bytes) -> str:
        from pipelines import fileio

        if self.left <= 0:
            return self.path
        self.left -= 1
        n = fileio.line_number(self.path, raw)
        return self.path if n is None else f"{self.path}:{n}"
