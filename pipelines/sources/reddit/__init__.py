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
crawl, ``run_crawl`` for the CLI and Dagster). This package re-exports their public names.

Credentials come only from praw's own environment variables (``praw_client_id``,
``praw_client_secret``, ``praw_user_agent``) of a read-only OAuth app; their values are never
logged, put in options, metadata or error messages.
"""

from pipelines.sources.reddit.api import (
    REDDIT_CREDENTIALS,
    api_error,
    default_user_agent,
    make_reddit,
    missing_credentials,
    require_credentials,
)
from pipelines.sources.reddit.candidates import ReadCandidatePosts, RefreshScores
from pipelines.sources.reddit.config import (
    DEFAULT_OVERLAP_S,
    DUMP_FIELDS,
    POST_KEYS,
    REDDIT_OPTIONS,
    RedditConfig,
    reddit_config,
)
from pipelines.sources.reddit.crawl import crawl_new_posts, gap_warning, run_crawl, submission_record
from pipelines.sources.reddit.dumps import (
    ReadSubmissionFile,
    StreamTruncated,
    dump_month,
    iter_decompressed,
    list_input_files,
    split_lines,
)
from pipelines.sources.reddit.normalise import (
    album_of,
    candidate,
    filter_reason,
    normalize_submission,
    pick_latest,
)

__all__ = [
    "DEFAULT_OVERLAP_S",
    "DUMP_FIELDS",
    "POST_KEYS",
    "REDDIT_CREDENTIALS",
    "REDDIT_OPTIONS",
    "ReadCandidatePosts",
    "ReadSubmissionFile",
    "RedditConfig",
    "RefreshScores",
    "StreamTruncated",
    "album_of",
    "api_error",
    "candidate",
    "crawl_new_posts",
    "default_user_agent",
    "dump_month",
    "filter_reason",
    "gap_warning",
    "iter_decompressed",
    "list_input_files",
    "make_reddit",
    "missing_credentials",
    "normalize_submission",
    "pick_latest",
    "reddit_config",
    "require_credentials",
    "run_crawl",
    "split_lines",
    "submission_record",
]
