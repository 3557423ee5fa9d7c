"""Reading submission files: pushshift dumps (zstd with long windows, bz2, xz) and the crawl's
ndjson files, as a stream of lines per file (``ReadSubmissionFile``).
"""

from __future__ import annotations

import bz2
import json
import logging
import lzma
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import zstandard
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines import fileio
from pipelines.records import count, dead_letter
from pipelines.sources.reddit.config import (
    BOMB_FLOOR,
    DATA_SUFFIXES,
    DUMP_MONTH_RE,
    MAX_LINE_BYTES,
    MAX_RATIO,
    OUT_CHUNK,
    READ_SIZE,
    SNIFF_LINES,
    ZSTD_FEED,
    RedditConfig,
    month_epoch,
)
from schemas.errors import MmlinksError

log = logging.getLogger(__name__)


def _decompressor_factory(path: str) -> Callable[[], Any] | None:
    """A new-frame decompressor for the file's codec, or None for plain ndjson."""
    name = path.lower()
    if name.endswith(".zst"):
        # The dumps use long windows (up to 2 GiB); the default limit (128 MiB) rejects them.
        dctx = zstandard.ZstdDecompressor(max_window_size=2**31)
        return dctx.decompressobj
    if name.endswith(".bz2"):  # pushshift's older monthly files
        return bz2.BZ2Decompressor
    if name.endswith(".xz"):
        return lzma.LZMADecompressor
    return None


_STREAM_ERRORS = (zstandard.ZstdError, OSError, EOFError, lzma.LZMAError, zlib.error, ValueError)


class StreamTruncated(Exception):
    """The compressed stream ended inside a frame, or its data is corrupt."""


class DecompressionBomb(Exception):
    """The file expands far more than any real dump: refused before it costs hours of CPU."""


@dataclass
class Bounds:
    """How far a file may expand: at most ``max_ratio`` x its compressed bytes read so far,
    once past ``floor`` bytes of output (small files and the first bytes are never judged)."""

    max_ratio: float = MAX_RATIO
    floor: int = BOMB_FLOOR


def _bounded(dobj) -> bool:
    return isinstance(dobj, bz2.BZ2Decompressor | lzma.LZMADecompressor)


def _pieces(dobj, feed: bytes) -> Iterator[bytes]:
    """Decompress ``feed`` with a bounded output per call: bz2/xz by ``max_length``; zstd, whose
    decompressobj has none, gets at most ``ZSTD_FEED`` bytes per call (see ``iter_decompressed``)."""
    if not _bounded(dobj):
        yield dobj.decompress(feed)
        return
    yield dobj.decompress(feed, OUT_CHUNK)
    while not dobj.eof and not dobj.needs_input:
        yield dobj.decompress(b"", OUT_CHUNK)


def iter_decompressed(
    fh, path: str, read_size: int = READ_SIZE, bounds: Bounds | None = None
) -> Iterator[bytes]:
    """Decompressed chunks of a (multi-frame) compressed file, each of bounded size (see
    ``ZSTD_FEED``); raises StreamTruncated at the end when the last frame is incomplete (zstd's
    stream reader would just stop) or data is corrupt, DecompressionBomb past ``bounds``."""
    bounds = bounds or Bounds()
    factory = _decompressor_factory(path)
    dobj = None
    read = written = 0
    while True:
        raw = fh.read(read_size)
        if not raw:
            break
        read += len(raw)
        if factory is None:
            yield raw
            continue
        while raw:
            if dobj is None:
                dobj = factory()
            cut = len(raw) if _bounded(dobj) else ZSTD_FEED
            feed, raw = raw[:cut], raw[cut:]
            try:
                for out in _pieces(dobj, feed):
                    written += len(out)
                    if written > bounds.floor and written > bounds.max_ratio * read:
                        raise DecompressionBomb(
                            f"{written} bytes out of {read} compressed bytes read, over "
                            f"{bounds.max_ratio:g}x; refused"
                        )
                    if out:
                        yield out
            except _STREAM_ERRORS as exc:
                raise StreamTruncated(f"corrupt data: {type(exc).__name__}: {exc}") from exc
            if dobj.eof:  # a frame ended; what follows is the next frame
                raw = dobj.unused_data + raw
                dobj = None
    if dobj is not None:
        raise StreamTruncated("the stream ends inside a compressed frame")


def split_lines(chunks: Iterable[bytes], max_line: int = MAX_LINE_BYTES) -> Iterator[bytes | None]:
    """Lines (without b"\\n") of a byte stream; splitting on bytes keeps a multi-byte UTF-8
    character that spans two chunks whole. Yields None for a line longer than ``max_line``
    (skipped up to its newline); a final line without newline is yielded too."""
    pending: list[bytes] = []
    pending_len = 0
    overlong = False
    for chunk in chunks:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                rest = chunk[start:]
                if not overlong:
                    pending.append(rest)
                    pending_len += len(rest)
                    if pending_len > max_line:
                        pending, pending_len, overlong = [], 0, True
                break
            if overlong:
                yield None
            else:
                piece = chunk[start:nl]
                yield b"".join(pending) + piece if pending else piece
            pending, pending_len, overlong = [], 0, False
            start = nl + 1
    if overlong:
        yield None
    elif pending_len:
        yield b"".join(pending)


def dump_month(path: str) -> tuple[int, int] | None:
    """(year, month) of a monthly dump ``RS_YYYY-MM.*`` (all subreddits, one creation month)."""
    m = DUMP_MONTH_RE.match(path.replace("\\", "/").rsplit("/", 1)[-1])
    return (int(m.group(1)), int(m.group(2))) if m else None


def list_input_files(input_uri: str, config: RedditConfig | None = None) -> list[str]:
    """The submission files under ``input_uri`` (a file, a folder searched recursively, or a glob).

    Comment dumps (``RC_*``, ``*_comments.*``) are left out, and so are monthly dumps whose
    month is outside [start, end] (each holds a whole month of every subreddit: skipping them
    is most of the work saved).
    """
    uri = fileio.normalize(str(input_uri))
    if fileio.is_local(uri) and not re.search(r"[*?\[]", uri):
        if os.path.isfile(uri):
            return [uri]
        if not os.path.isdir(uri):
            raise MmlinksError(f"Reddit input {uri} does not exist")
    try:
        paths = fileio.list_files(uri)
    except Exception as exc:  # FileSystems raises BeamIOError and friends
        raise MmlinksError(f"cannot list Reddit input {uri}: {exc}") from exc
    out = []
    for p in paths:
        name = p.replace("\\", "/").rsplit("/", 1)[-1]
        lower = name.lower()
        if not lower.endswith(DATA_SUFFIXES) or lower.startswith("rc_") or "_comments." in lower:
            continue
        month = dump_month(p)
        if config is not None and month is not None:
            t = month_epoch(*month)
            if not config.start_utc <= t < config.end_utc:
                continue
        out.append(p)
    return out


class NotSubmissions(Exception):
    """None of a file's first lines is a Reddit submission: it is not a dump, whatever its name."""


def looks_like_submission(line: bytes | None) -> bool:
    """A JSON object with ``subreddit`` and ``id`` (or ``name``): what every dump line is."""
    if line is None or len(line) > 1 << 20:
        return False
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(rec, dict) and "subreddit" in rec and ("id" in rec or "name" in rec)


def submissions_only(lines: Iterator[bytes | None], sniff: int = SNIFF_LINES) -> Iterator[bytes | None]:
    """``lines`` unchanged once one of the first ``sniff`` non-blank lines is a submission; else
    raises NotSubmissions (naming the first of them) before yielding anything. An empty file passes."""
    head: list[bytes | None] = []
    tried = 0
    for line in lines:
        head.append(line)
        if line is not None and not line.strip():
            continue
        if looks_like_submission(line):
            yield from head
            yield from lines
            return
        tried += 1
        if tried >= sniff:
            break
    if tried:
        first = next(x for x in head if x is None or x.strip())
        shown = "(a line over the size limit)" if first is None else repr(first[:80])[1:]
        raise NotSubmissions(
            f"none of its first {tried} lines is a Reddit submission (a JSON object with subreddit "
            f"and id); the first: {shown}"
        )
    yield from head


class ReadSubmissionFile(beam.DoFn):
    """One file -> its lines as ``(file name, line number, bytes)``.

    Compressed files are not splittable, so each file is read by one worker as a stream. A
    truncated or corrupt stream keeps the lines read before the damage and dead-letters once
    (``line:truncated_stream``); an over-long line dead-letters as ``line:too_long``; a file
    that expands past ``bounds`` as ``line:decompression_bomb``. A file whose first lines are
    not submissions (a folder of other JSON files given as --input) is not read further:
    ``file:not_submissions``. Each file taken as a dump is logged and counted by kind
    (``reddit_files_read:zst``, ...).
    """

    def __init__(
        self, read_size: int = READ_SIZE, max_line: int = MAX_LINE_BYTES, bounds: Bounds | None = None
    ):
        self.read_size = read_size
        self.max_line = max_line
        self.bounds = bounds or Bounds()

    def process(self, path: str):
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        n = 0
        count("reddit_files_read")
        count(f"reddit_files_read:{name.rsplit('.', 1)[-1].lower()}")
        log.info("reading %s as a Reddit submission file", path)
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
                chunks = iter_decompressed(fh, path, self.read_size, self.bounds)
                for line in submissions_only(split_lines(chunks, self.max_line)):
                    n += 1
                    if line is None:
                        yield dead_letter("line", f"{name}:{n}", "too_long", f"over {self.max_line} bytes")
                    elif line.strip():
                        yield name, n, line
        except NotSubmissions as exc:
            yield dead_letter("file", name, "not_submissions", str(exc))
        except StreamTruncated as exc:
            # The partial last line was never yielded: split_lines only ends lines at b"\n"
            # or at the end of a stream that is *not* truncated (the exception comes first).
            yield dead_letter("line", name, "truncated_stream", f"{exc}; kept the {n} lines before it")
        except DecompressionBomb as exc:
            yield dead_letter("line", name, "decompression_bomb", f"{exc}; kept the {n} lines before it")
        except OSError as exc:
            yield dead_letter("line", name, "unreadable_file", f"{type(exc).__name__}: {exc}")
        count("reddit_lines_read", n)
