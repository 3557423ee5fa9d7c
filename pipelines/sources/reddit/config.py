"""The Reddit options (``--source-option``), their parsed form :class:`RedditConfig`, and the
record shapes shared by the reader and the crawl (``POST_KEYS``, ``DUMP_FIELDS``).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass

from pipelines.sources.base import SourceContext, SourceOption
from pipelines.sources.reddit.api import require_credentials
from schemas.errors import MmlinksError

REDDIT_OPTIONS: tuple[SourceOption, ...] = (
    SourceOption("subreddit", "DIY", "subreddit to keep (case-insensitive)"),
    SourceOption("start", "2013-01", "first month kept (YYYY-MM, UTC, inclusive)"),
    SourceOption("end", "2018-10", "last month kept (YYYY-MM, UTC, inclusive)"),
    SourceOption("min_score", "25", "keep posts whose (refreshed) score is at least this"),
    SourceOption(
        "galleries",
        "false",
        'also keep imgur /gallery/ (and /t/<tag>/) links: false is the paper\'s rule ("/a/" in the '
        "URL: albums only), true adds gallery posts",
    ),
    SourceOption(
        "refresh_scores",
        "auto",
        "refresh dump scores through the Reddit API: auto (when praw_client_id and "
        "praw_client_secret are set), true (require them), false (keep dump scores)",
    ),
    SourceOption(
        "reddit_api_base",
        None,
        "base URL replacing https://oauth.reddit.com and https://www.reddit.com (tests, proxies)",
        defines_data=False,
    ),
)


# Keys of each element of ReadCandidatePosts' "posts" output (all always present):
#   id (str, no t3_ prefix), subreddit (str, as in the data), author (str; "[deleted]" when
#   gone), created_utc (int), title (str), selftext (str), url (str), domain (str),
#   permalink (str), num_comments (int), over_18 (bool), score (int: refreshed when possible),
#   dump_score (int: the score in the file), score_refreshed (bool), retrieved_on (int | None),
#   album_id (str: the imgur album id from url), album_kind ("a" | "gallery").
POST_KEYS = (
    "id",
    "subreddit",
    "author",
    "created_utc",
    "title",
    "selftext",
    "url",
    "domain",
    "permalink",
    "num_comments",
    "over_18",
    "score",
    "dump_score",
    "score_refreshed",
    "retrieved_on",
    "album_id",
    "album_kind",
)

# Fields written by crawl_new_posts, in the dumps' names (2013-2018 dumps have all but the
# last; removed_by_category exists from late 2019).
DUMP_FIELDS = (
    "id",
    "name",
    "subreddit",
    "subreddit_id",
    "author",
    "created_utc",
    "title",
    "selftext",
    "url",
    "domain",
    "is_self",
    "score",
    "ups",
    "num_comments",
    "permalink",
    "over_18",
    "thumbnail",
    "stickied",
    "edited",
    "distinguished",
    "retrieved_on",
    "removed_by_category",
)

INFO_BATCH = 100  # ids per /api/info call (the API's maximum)
READ_SIZE = 1 << 20  # compressed bytes per read
MAX_LINE_BYTES = 32 << 20  # longer "lines" are corrupt data, not submissions
# Decompression bounds. zstd's densest block (RLE: 4 bytes -> 128 KiB) expands 32768-fold, so
# compressed input is fed ZSTD_FEED bytes at a time: one call then returns at most
# (ZSTD_FEED / 4 + 1) * 128 KiB (~16 MiB); bz2 and xz take OUT_CHUNK as their max_length.
ZSTD_FEED = 512
OUT_CHUNK = 4 << 20
# A file that expands more than MAX_RATIO-fold (pushshift's JSON: 8-15x even at --ultra -22
# --long=31) after BOMB_FLOOR bytes of output is a decompression bomb: refused, dead-lettered.
MAX_RATIO = 1000
BOMB_FLOOR = 32 << 20
SNIFF_LINES = 8  # a file none of whose first 8 non-blank lines is a submission is not a dump
LISTING_LIMIT = 1000  # Reddit listings end after about this many items
# The crawl reads this far (seconds of creation time) below its checkpoint: posts approved late
# (mod queue, spam filter) show up in /new at their original time, below newer posts.
DEFAULT_OVERLAP_S = 86400
# Ids (with their creation times) remembered in the crawl cursor to skip posts already fetched:
# those of the overlap window, and those fetched past a gap; the newest this many are kept.
RECENT_IDS_KEPT = 5000
GAPS_KEPT = 100  # unrecoverable gaps remembered in the cursor (for a backfill from the dumps)

_MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")
DUMP_MONTH_RE = re.compile(r"^RS_(?:v2_)?(\d{4})-(\d{2})\b")
DATA_SUFFIXES = (".zst", ".ndjson", ".jsonl", ".json", ".bz2", ".xz")


@dataclass(frozen=True)
class RedditConfig:
    """The parsed, validated options (picklable: it travels to the workers)."""

    subreddit: str  # lower-case
    start_utc: int  # first second of the start month
    end_utc: int  # first second after the end month
    min_score: int
    refresh: str  # auto | true | false
    api_base: str | None
    galleries: bool = False  # keep /gallery/ links too (the paper: "/a/" only)


def _month_start(value: str, name: str) -> tuple[int, int]:
    m = _MONTH_RE.match(value.strip())
    if not m or not 1 <= int(m.group(2)) <= 12:
        raise MmlinksError(f"--source-option {name} wants a month YYYY-MM, not {value!r}")
    return int(m.group(1)), int(m.group(2))


def month_epoch(year: int, month: int) -> int:
    return calendar.timegm((year, month, 1, 0, 0, 0))


def reddit_config(ctx: SourceContext) -> RedditConfig:
    """Parse and check the Reddit options; raises MmlinksError before anything runs.

    ``refresh_scores=true`` without credentials fails here, up front, naming the variables.
    """
    sub = (ctx.str("subreddit") or "").strip()
    if not re.fullmatch(r"[A-Za-z0-9_]{2,21}", sub):
        raise MmlinksError(f"--source-option subreddit wants a subreddit name, not {sub!r}")
    sy, sm = _month_start(ctx.str("start") or "", "start")
    ey, em = _month_start(ctx.str("end") or "", "end")
    start, end = month_epoch(sy, sm), month_epoch(ey + (em == 12), em % 12 + 1)
    if end <= start:
        raise MmlinksError(f"--source-option end ({ctx.str('end')}) is before start ({ctx.str('start')})")
    min_score = ctx.int("min_score")
    refresh = (ctx.str("refresh_scores") or "auto").strip().lower()
    if refresh in ("1", "yes", "on"):
        refresh = "true"
    elif refresh in ("0", "no", "off"):
        refresh = "false"
    if refresh not in ("auto", "true", "false"):
        raise MmlinksError(f"--source-option refresh_scores wants auto, true or false, not {refresh!r}")
    if refresh == "true":
        require_credentials("refresh_scores=true")
    api_base = (ctx.str("reddit_api_base") or "").strip().rstrip("/") or None
    if api_base is not None and not re.match(r"^https?://", api_base):
        raise MmlinksError(f"--source-option reddit_api_base wants an http(s) URL, not {api_base!r}")
    return RedditConfig(
        subreddit=sub.lower(),
        start_utc=start,
        end_utc=end,
        min_score=-(2**62) if min_score is None else min_score,
        refresh=refresh,
        api_base=api_base,
        galleries=ctx.bool("galleries"),
    )
