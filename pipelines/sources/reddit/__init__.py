"""Reddit submissions: candidate r/DIY imgur-album posts from dumps plus an incremental crawl.

The paper (Hessel et al. 2019, supplement "DIY") took every r/DIY submission from Jan 2013 to
Oct 2018 out of pushshift's monthly dumps, kept link posts to imgur albums ("/a/" in the URL)
with score >= 25, then scraped the albums. This module covers the Reddit half:

- ``ReadCandidatePosts``: dump files (``RS_YYYY-MM.zst`` monthly dumps of every subreddit,
  ``<sub>_submissions.zst`` per-subreddit dumps, and the ``*.ndjson[.zst]`` files that
  ``crawl_new_posts`` writes) -> de-duplicated (the latest copy of each post), filtered,
  score-refreshed candidate posts.
  Dump scores were taken minutes to days after posting and can be far too low, so the scores
  of the candidates are refreshed through the API (100 ids per call) before the score filter.
- ``crawl_new_posts``: the incremental crawl of ``/r/<sub>/new`` with praw, checkpointed in a
  ``CrawlState`` cursor, writing files in the dump format so the same reader takes both.

The album scraping is ``pipelines.sources.imgur``; ``pipelines.sources.diy`` composes the two.

Modules: ``config`` (options, RedditConfig, record shapes), ``api`` (praw client, credentials,
one-line API errors), ``dumps`` (compressed files -> lines), ``normalise`` (lines -> posts,
filters), ``candidates`` (the Beam transform ReadCandidatePosts), ``crawl`` (the incremental
crawl, ``run_crawl`` for the CLI and Dagster). This package re-exports their public names,
each imported on first use: Beam and praw load only when needed (the CLI's parser reads
``config``).

Credentials come only from praw's own environment variables (``praw_client_id``,
``praw_client_secret``, ``praw_user_agent``) of a read-only OAuth app; their values are never
logged, put in options, metadata or error messages.
"""

from __future__ import annotations

import importlib

# public name -> the module that defines it
_EXPORTS = {
    "DEFAULT_OVERLAP_S": "config",
    "DUMP_FIELDS": "config",
    "POST_KEYS": "config",
    "REDDIT_CREDENTIALS": "api",
    "REDDIT_OPTIONS": "config",
    "ReadCandidatePosts": "candidates",
    "ReadSubmissionFile": "dumps",
    "RedditConfig": "config",
    "RefreshScores": "candidates",
    "StreamTruncated": "dumps",
    "album_of": "normalise",
    "api_error": "api",
    "candidate": "normalise",
    "crawl_new_posts": "crawl",
    "default_user_agent": "api",
    "dump_month": "dumps",
    "filter_reason": "normalise",
    "gap_warning": "crawl",
    "iter_decompressed": "dumps",
    "list_input_files": "dumps",
    "make_reddit": "api",
    "missing_credentials": "api",
    "normalize_submission": "normalise",
    "pick_latest": "normalise",
    "reddit_config": "config",
    "require_credentials": "api",
    "run_crawl": "crawl",
    "split_lines": "dumps",
    "submission_record": "crawl",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
