"""The tokenizer is part of the data contract: the dataset build drops sentences with no
tokens, and training builds its vocabulary from the same tokens, so both import it from here.

It follows the behaviour of a tweet-style tokenizer as the paper uses it (lowercase; URLs,
@handles, #tags, emoticons and word-internal apostrophes/hyphens kept whole; other
punctuation split off).
"""

from __future__ import annotations

import re

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


def has_tokens(text: str) -> bool:
    """A sentence counts only if it has a word or number; bare punctuation does not."""
    return any(any(c.isalnum() for c in tok) for tok in tokenize(text))
