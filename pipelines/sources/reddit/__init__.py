"""Reddit submissions: candidate r/DIY imgur-album posts from dumps plus an incremental crawl.

The paper (Hessel et al. 2019, supplement "DIY") took every r/DIY submission from Jan 2013 to
Oct 2018 out of pushshift's monthly dumps, kept link posts to imgur albums with score >= 25,
then scraped the albums (``pipelines.sources.imgur``; ``diy`` composes the two). Here the Reddit
half: ``ReadCandidatePosts`` (dump files -> the latest copy of each post, filtered, its score
refreshed through the API because dump scores were taken minutes to days after posting) and
``crawl_new_posts`` (``/r/<sub>/new`` with praw, checkpointed, written in the dump format so the
same reader takes both); docs/sources.md has the details. The submodules' public names are
re-exported, each imported on first use: Beam and praw load only when needed (the CLI's parser
reads ``config``). Credentials come only from praw's own environment variables, and their
values are never logged, put in options, metadata or error messages.
"""

from __future__ import annotations

import importlib

# public name -> the module that defines it
_EXPORTS = {
    "DUMP_FIELDS": "config",
    "POST_KEYS": "config",
    "REDDIT_CREDENTIALS": "api",
    "REDDIT_OPTIONS": "config",
    "ReadCandidatePosts": "candidates",
    "StreamTruncated": "dumps",
    "album_of": "normalise",
    "crawl_new_posts": "crawl",
    "default_user_agent": "api",
    "dump_month": "dumps",
    "filter_reason": "normalise",
    "gap_warning": "crawl",
    "iter_decompressed": "dumps",
    "list_input_files": "dumps",
    "make_reddit": "api",
    "normalize_submission": "normalise",
    "pick_latest": "normalise",
    "reddit_config": "config",
    "run_crawl": "crawl",
    "split_lines": "dumps",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
