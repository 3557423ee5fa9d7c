"""Stream the items of the top-level arrays of a big JSON object without loading the whole file
(RecipeQA, MSCOCO, VIST: up to a few hundred MB, several GB through ``json.load``).

Why not ijson (docs/benchmarks.md, "Streaming JSON readers"): ~1.1x faster, and it fails inputs
the sources must survive (bad UTF-8 ends the file, a BOM errors, surrogates become ``?``, deep
nesting is unbounded, huge integers crash the process). Bytes decode with ``surrogateescape`` so
``has_invalid_utf8`` dead-letters exactly the bad items; nesting past ``MAX_DEPTH`` is
``MalformedJson``, not a recursion crash later; ``loads`` applies the same cap to one line."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Collection, Iterable, Iterator
from typing import Any, BinaryIO

CHUNK_BYTES = 1 << 20
# A single value larger than this is treated as corrupt rather than buffered without bound.
MAX_VALUE_CHARS = 256 << 20
# A decode error this close to the end of the buffer may just be a value cut by the chunk edge.
_EDGE = 32
_WS = frozenset(" \t\n\r")
_NUMBER_CHARS = frozenset("0123456789.eE+-")
_INVALID_UTF8 = re.compile("[\udc80-\udcff]")
MAX_DEPTH = 100


class MalformedJson(ValueError):
    """The text is not a JSON object of the expected shape; ``pos`` is a character offset."""

    def __init__(self, message: str, pos: int):
        super().__init__(f"{message} (at character {pos})")
        self.pos = pos


def depth(value: Any) -> int:
    """How many arrays/objects nest in ``value`` (0 for a scalar); iterative, any depth."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _too_deep(obj: Any, text: str, start: int, end: int, above: int) -> bool:
    """Whether ``obj`` (decoded from ``text[start:end]``) nests deeper than ``MAX_DEPTH`` with
    ``above`` levels around it; a cheap count of brackets unless the text has that many."""
    budget = MAX_DEPTH - above
    return text.count("[", start, end) + text.count("{", start, end) > budget and depth(obj) > budget


def loads(text: str) -> Any:
    """``json.loads`` with the nesting cap: ``MalformedJson`` (a ``ValueError``) when the text is
    not JSON or nests deeper than ``MAX_DEPTH``, never ``RecursionError``."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise MalformedJson(f"a value nested deeper than {MAX_DEPTH} levels", 0) from None
    if _too_deep(obj, text, 0, len(text), 0):
        raise MalformedJson(f"a value nested deeper than {MAX_DEPTH} levels", 0)
    return obj


def text_chunks(fh: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[str]:
    """UTF-8 text of a binary file in chunks; a character split across chunks is reassembled."""
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    first = True
    while True:
        raw = fh.read(chunk_bytes)
        text = decoder.decode(raw or b"", final=not raw)
        if first and text:
            text = text.removeprefix("\ufeff")  # a byte-order mark is not JSON
            first = False
        if text:
            yield text
        if not raw:
            return


def has_invalid_utf8(value: Any) -> bool:
    """True when a string in ``value`` (keys included) holds bytes that were not valid UTF-8."""
    if isinstance(value, str):
        return bool(_INVALID_UTF8.search(value))
    if isinstance(value, dict):
        return any(has_invalid_utf8(k) or has_invalid_utf8(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_invalid_utf8(v) for v in value)
    return False


class _Reader:
    """A text buffer over the chunks with a read position; refills on demand."""

    def __init__(self, chunks: Iterable[str]):
        self._chunks = iter(chunks)
        self.buf = ""
        self.pos = 0
        self.offset = 0  # characters dropped from the front of buf
        self.eof = False
        self._decoder = json.JSONDecoder()

    def fail(self, message: str) -> MalformedJson:
        return MalformedJson(message, self.offset + self.pos)

    def more(self) -> bool:
        if self.eof:
            return False
        if self.pos > (1 << 16) and self.pos * 2 > len(self.buf):
            self.buf = self.buf[self.pos :]
            self.offset += self.pos
            self.pos = 0
        for chunk in self._chunks:
            if chunk:
                self.buf += chunk
                return True
        self.eof = True
        return False

    def peek(self) -> str:
        """The next non-whitespace character ('' at the end), without consuming it."""
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self.more():
                return ""

    def expect(self, char: str) -> None:
        got = self.peek()
        if got != char:
            raise self.fail(f"expected {char!r}, found {got or 'the end of the file'!r}")
        self.pos += 1

    def value(self, above: int = 0) -> Any:
        """Decode one JSON value at the read position (``above``: the levels enclosing it)."""
        if not self.peek():
            raise self.fail("expected a value, found the end of the file")
        while True:
            try:
                obj, end = self._decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise self.fail(f"a value nested deeper than {MAX_DEPTH} levels") from None
            except json.JSONDecodeError as exc:
                cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(self.buf) - _EDGE
                if cut and len(self.buf) - self.pos <= MAX_VALUE_CHARS and self.more():
                    continue
                raise MalformedJson(exc.msg, self.offset + exc.pos) from None
            except ValueError as exc:  # an integer past Python's 4300 digits
                raise self.fail(str(exc)[:200]) from None
            # A number cut by the chunk edge decodes as its prefix ("1" of "1.5"): when it ends at
            # the buffer's end or before a character that could continue it, read on and retry.
            if isinstance(obj, int | float) and not isinstance(obj, bool):
                if (end == len(self.buf) or self.buf[end] in _NUMBER_CHARS) and self.more():
                    continue
            if _too_deep(obj, self.buf, self.pos, end, above):
                raise self.fail(f"a value nested deeper than {MAX_DEPTH} levels")
            self.pos = end
            return obj

    def skip(self, above: int = 0) -> None:
        """Consume one value; arrays and objects item by item, so a big one is never buffered whole."""
        opener = self.peek()
        if opener in "[{" and above >= MAX_DEPTH:
            raise self.fail(f"a value nested deeper than {MAX_DEPTH} levels")
        if opener == "[":
            for _ in self.items(above):
                pass
        elif opener == "{":
            self.pos += 1
            if self.peek() == "}":
                self.pos += 1
                return
            while True:
                if not isinstance(self.value(), str):
                    raise self.fail("object keys must be strings")
                self.expect(":")
                self.skip(above + 1)
                if self._close("}"):
                    return
        else:
            self.value(above)

    def items(self, above: int = 0) -> Iterator[Any]:
        """The items of the array at the read position, decoded one at a time."""
        self.expect("[")
        if self.peek() == "]":
            self.pos += 1
            return
        while True:
            yield self.value(above + 1)
            if self._close("]"):
                return

    def _close(self, closer: str) -> bool:
        """After a member: True at the closing bracket (consumed), False after a comma."""
        got = self.peek()
        self.pos += 1
        if got == closer:
            return True
        if got != ",":
            self.pos -= 1
            raise self.fail(f"expected ',' or {closer!r}, found {got or 'the end of the file'!r}")
        return False


def stream_arrays(
    chunks: Iterable[str], keys: Collection[str], required: Collection[str] = ()
) -> Iterator[tuple[str, Any]]:
    """``(key, item)`` for every item of the arrays under ``keys`` in a top-level JSON object.

    Items come in file order; other members are skipped. Raises ``MalformedJson`` (after the
    items before the fault were yielded) when the text is not a JSON object, a member under
    ``keys`` is not an array, a key in ``required`` is missing, or anything follows the object.
    """
    reader = _Reader(chunks)
    seen: set[str] = set()
    for key in _members(reader):
        if key in keys:
            if reader.peek() != "[":
                raise reader.fail(f"{key!r} is not a list")
            seen.add(key)
            for item in reader.items(1):
                yield key, item
        else:
            reader.skip(1)
    missing = sorted(set(required) - seen)
    if missing:
        raise reader.fail(f"no {', '.join(repr(k) for k in missing)} list in the object")


def repaired(value: Any) -> Any:
    """``value`` with escaped lone surrogates (``"\\ud83d"`` in the JSON) replaced and counted.

    They are valid JSON but no encoder takes them: Beam's coders would crash the build at the
    next stage boundary. Call it on every item a source parsed, after the ``has_invalid_utf8``
    check (invalid *bytes* are dead-lettered; escaped surrogates are repaired).
    """
    from pipelines.records import count
    from schemas.text import repair_strings

    fixed, n = repair_strings(value)
    if n:
        count("text_repaired", n)
    return fixed


def stream_members(chunks: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """``(key, value)`` of every member of a top-level JSON object, one value decoded at a time
    (GoodNews's ``captioning_dataset.json`` is one object keyed by article id). Raises
    ``MalformedJson`` (after the members before the fault were yielded) like ``stream_arrays``."""
    reader = _Reader(chunks)
    for key in _members(reader):
        yield key, reader.value(1)


def _members(reader: _Reader) -> Iterator[str]:
    """The keys of the top-level JSON object, in file order, the reader left at each key's value
    (the caller reads or skips it before asking for the next key); then nothing may follow."""
    reader.expect("{")
    if reader.peek() == "}":
        reader.pos += 1
    else:
        while True:
            key = reader.value()
            if not isinstance(key, str):
                raise reader.fail("object keys must be strings")
            reader.expect(":")
            yield key
            if reader._close("}"):
                break
    if reader.peek():
        raise reader.fail("data after the top-level object")
