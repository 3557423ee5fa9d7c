"""Reddit submissions: candidate r/DIY imgur-album posts from dumps plus an incremental crawl
(docs/sources.md).

``ReadCandidatePosts`` reads dumps (latest copy of each post, score refreshed through the API:
dump scores were taken too early); ``crawl_new_posts`` crawls ``/r/<sub>/new`` into the same
format. Why names are imported on first use: Beam and praw load only when needed. Credentials
come only from praw's environment variables and are never logged."""

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
