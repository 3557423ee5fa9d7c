"""Reading submission files: pushshift dumps (zstd with long windows, bz2, xz) and the crawl's
ndjson files, as a stream of lines per file (``ReadSubmissionFile``).
"""

from __future__ import annotations

import bz2
import lzma
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
import zstandard
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines import fileio
from pipelines.records import count, dead_letter
from pipelines.sources.reddit.config import (
    DATA_SUFFIXES,
    DUMP_MONTH_RE,
    MAX_LINE_BYTES,
    READ_SIZE,
    RedditConfig,
    month_epoch,
)
from schemas.errors import MmlinksError


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


def iter_decompressed(fh, path: str, read_size: int = READ_SIZE) -> Iterator[bytes]:
    """Decompressed chunks of a (multi-frame) compressed file; raises StreamTruncated at the end
    when the last frame is incomplete (zstd's stream reader would just stop) or data is corrupt."""
    factory = _decompressor_factory(path)
    dobj = None
    while True:
        raw = fh.read(read_size)
        if not raw:
            break
        if factory is None:
            yield raw
            continue
        while raw:
            if dobj is None:
                dobj = factory()
            try:
                out = dobj.decompress(raw)
            except _STREAM_ERRORS as exc:
                raise StreamTruncated(f"corrupt data: {type(exc).__name__}: {exc}") from exc
            if out:
                yield out
            if dobj.eof:  # a frame ended; what follows is the next frame
                raw = dobj.unused_data
                dobj = None
            else:
                raw = b""
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


class ReadSubmissionFile(beam.DoFn):
    """One file -> its lines as ``(file name, line number, bytes)``.

    Compressed files are not splittable, so each file is read by one worker as a stream. A
    truncated or corrupt stream keeps the lines read before the damage and dead-letters once
    (``line:truncated_stream``); an over-long line dead-letters as ``line:too_long``.
    """

    def __init__(self, read_size: int = READ_SIZE, max_line: int = MAX_LINE_BYTES):
        self.read_size = read_size
        self.max_line = max_line

    def process(self, path: str):
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        n = 0
        count("reddit_files_read")
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
                for line in split_lines(iter_decompressed(fh, path, self.read_size), self.max_line):
                    n += 1
                    if line is None:
                        yield dead_letter("line", f"{name}:{n}", "too_long", f"over {self.max_line} bytes")
                    elif line.strip():
                        yield name, n, line
        except StreamTruncated as exc:
            # The partial last line was never yielded: split_lines only ends lines at b"\n"
            # or at the end of a stream that is *not* truncated (the exception comes first).
            yield dead_letter("line", name, "truncated_stream", f"{exc}; kept the {n} lines before it")
        except OSError as exc:
            yield dead_letter("line", name, "unreadable_file", f"{type(exc).__name__}: {exc}")
        count("reddit_lines_read", n)
