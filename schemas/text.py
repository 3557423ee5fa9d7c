"""The tokenizer is part of the data contract: the build drops token-less sentences and training
builds its vocabulary from the same tokens. Tweet-style, as the paper's (lowercase; URLs,
handles, tags, emoticons and inner apostrophes/hyphens kept whole)."""

from __future__ import annotations

import re
from itertools import islice

_TOKEN_RE = re.compile(
    r"""
    https?://\S+                      # URLs
  | [@#]\w+                           # handles and hashtags
  | [<>]?[:;=8][\-o*']?[)\](\[dDpP/\\]  # simple emoticons
  | \d+(?:[.,:/]\d+)*                 # numbers, times, fractions, dates
  | \w+(?:['\-]\w+)*                  # words, with internal apostrophes or hyphens
  | \.{2,}                            # ellipses
  | [^\w\s]                           # any other single non-space symbol
    """,
    re.VERBOSE | re.UNICODE,
)


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text.lower())


def first_tokens(text: str, n: int) -> list[str]:
    """``tokenize(text)[:n]`` without tokenising the rest (a served article's 400-word body cut
    to 100 tokens: docs/benchmarks.md, issue #18)."""
    if n < 0:
        return tokenize(text)[:n]
    return [m.group() for m in islice(_TOKEN_RE.finditer(text.lower()), n)]


def has_tokens(text: str) -> bool:
    """A sentence counts only if it has a word or number; bare punctuation does not. Stops at
    the first such token."""
    return any(any(c.isalnum() for c in m.group()) for m in _TOKEN_RE.finditer(text.lower()))


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def repair_surrogates(text: str) -> tuple[str, int]:
    """The one text repair: ``text`` with each lone UTF-16 surrogate replaced by U+FFFD (a split
    high/low pair is joined into its character), and how many were replaced.

    ``json.loads('"\\ud83d"')`` gives a str that cannot be encoded as UTF-8, so one such
    caption in a scraped page would crash Beam's coders, the crawl-state record or the Parquet
    writer of a whole build.
    """
    if not _SURROGATE_RE.search(text):
        return text, 0
    fixed = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return fixed, fixed.count("\ufffd") - text.count("\ufffd")


def repair_text(text: str) -> tuple[str, bool]:
    """(``repair_surrogates(text)``'s text, whether it differs from ``text``)."""
    fixed, _ = repair_surrogates(text)
    return fixed, fixed != text


def repair_strings(value):
    """``value`` (str / list / dict, nested) with ``repair_text`` applied; and how many strings changed.

    Sources call this on every record parsed from JSON before it leaves the parsing step: Beam's
    own coders cannot encode a lone surrogate either, so one would crash the build at the next
    stage boundary, long before the shard writer.
    """
    if isinstance(value, str):
        fixed, changed = repair_text(value)
        return fixed, int(changed)
    if isinstance(value, list):
        out, n = [], 0
        for v in value:
            fixed, k = repair_strings(v)
            out.append(fixed)
            n += k
        return out, n
    if isinstance(value, dict):
        out_d, n = {}, 0
        for key, v in value.items():
            fixed_key, k1 = repair_strings(key)
            fixed, k2 = repair_strings(v)
            out_d[fixed_key] = fixed
            n += k1 + k2
        return out_d, n
    return value, 0
