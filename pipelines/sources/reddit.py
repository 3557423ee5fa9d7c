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

Credentials come only from praw's own environment variables (``praw_client_id``,
``praw_client_secret``, ``praw_user_agent``) of a read-only OAuth app; their values are never
logged, put in options, metadata or error messages.
"""

from __future__ import annotations

import bz2
import calendar
import importlib.metadata
import json
import logging
import lzma
import os
import re
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import apache_beam as beam
import zstandard
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines import fileio
from pipelines.crawl_state import CrawlState
from pipelines.records import DEAD_LETTER, count, dead_letter
from pipelines.sources.base import SourceContext, SourceOption, env_credential
from pipelines.sources.imgur import parse_album_url
from pipelines.sources.jsonstream import repaired as _repaired
from schemas.errors import MmlinksError

log = logging.getLogger(__name__)

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

# praw's own environment variable names (a read-only OAuth app; no username or password).
REDDIT_CREDENTIALS = ("praw_client_id", "praw_client_secret", "praw_user_agent")
_REQUIRED_CREDENTIALS = REDDIT_CREDENTIALS[:2]

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
LISTING_LIMIT = 1000  # Reddit listings end after about this many items
# The crawl reads this far (seconds of creation time) below its checkpoint: posts approved late
# (mod queue, spam filter) show up in /new at their original time, below newer posts.
DEFAULT_OVERLAP_S = 86400
# Ids (with their creation times) remembered in the crawl cursor to skip posts already fetched:
# those of the overlap window, and those fetched past a gap; the newest this many are kept.
RECENT_IDS_KEPT = 5000
GAPS_KEPT = 100  # unrecoverable gaps remembered in the cursor (for a backfill from the dumps)

_MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")
_DUMP_MONTH_RE = re.compile(r"^RS_(?:v2_)?(\d{4})-(\d{2})\b")
_DATA_SUFFIXES = (".zst", ".ndjson", ".jsonl", ".json", ".bz2", ".xz")


# ---------------------------------------------------------------------------------------------
# Options


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


def _epoch(year: int, month: int) -> int:
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
    start, end = _epoch(sy, sm), _epoch(ey + (em == 12), em % 12 + 1)
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


def missing_credentials() -> list[str]:
    return [name for name in _REQUIRED_CREDENTIALS if env_credential(name) is None]


def require_credentials(why: str) -> None:
    """Raise a clear MmlinksError (names only, never values) when the API credentials are unset."""
    missing = missing_credentials()
    if missing:
        raise MmlinksError(
            f"{why} needs Reddit API credentials: set the environment variable(s) {', '.join(missing)} "
            f"(a read-only OAuth app from https://www.reddit.com/prefs/apps; optionally praw_user_agent)"
        )


def default_user_agent() -> str:
    """Reddit's requested format ``<platform>:<app id>:<version> (by u/<name>)``.

    Reddit asks for the operator's own account name here: set ``praw_user_agent`` to name it.
    """
    try:
        ver = importlib.metadata.version("mmlinks")
    except importlib.metadata.PackageNotFoundError:  # a source checkout, not installed
        ver = "0.1.0"
    return f"{sys.platform}:mmlinks:{ver} (by u/mmlinks-research)"


def make_reddit(api_base: str | None = None, **praw_kwargs: Any):
    """A read-only ``praw.Reddit`` from the environment's credentials.

    ``api_base`` replaces both https://oauth.reddit.com (API calls) and https://www.reddit.com
    (the token endpoint): prawcore accepts any http(s) base, which is how tests talk to a
    loopback fixture server through praw's real code path. Raises MmlinksError naming the
    missing variables (never their values).
    """
    import praw

    require_credentials("the Reddit API")
    settings: dict[str, Any] = {
        "client_id": env_credential("praw_client_id"),
        "client_secret": env_credential("praw_client_secret"),
        "user_agent": env_credential("praw_user_agent") or default_user_agent(),
        "check_for_updates": False,
        "check_for_async": False,
    }
    if api_base:
        settings["oauth_url"] = api_base
        settings["reddit_url"] = api_base
    settings.update(praw_kwargs)
    reddit = praw.Reddit(**settings)
    reddit.read_only = True
    return reddit


# ---------------------------------------------------------------------------------------------
# Reading dump files


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
    m = _DUMP_MONTH_RE.match(path.replace("\\", "/").rsplit("/", 1)[-1])
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
        if not lower.endswith(_DATA_SUFFIXES) or lower.startswith("rc_") or "_comments." in lower:
            continue
        month = dump_month(p)
        if config is not None and month is not None:
            t = _epoch(*month)
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


# ---------------------------------------------------------------------------------------------
# Parsing and filtering


def _as_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return None


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    return None


def _str(value: Any, default: str = "") -> str:
    return default if value is None else str(value)


def album_of(url: str, galleries: bool = False) -> tuple[str, str] | None:
    """(kind, album id) of an imgur album URL (and gallery URL when ``galleries``), else None.

    The album scraper's own parser (``imgur.parse_album_url``) decides, so the posts kept here
    are exactly the ones it can fetch: ``/a/<id>`` (kind ``a``); with ``galleries`` also
    ``/gallery/<id>`` and ``/t/<tag>/<id>`` (kind ``gallery``). Without it this is the paper's
    rule, '"/a/" in the URL'.
    """
    parsed = parse_album_url(url)
    if parsed is None or (parsed[0] != "a" and not galleries):
        return None
    return parsed


def normalize_submission(rec: dict) -> dict:
    """A dump/API submission with its field quirks smoothed over; raises ValueError when unusable.

    created_utc arrives as int, float or string; score may be missing (then ups, then 0); the
    id may carry the ``t3_`` prefix (or only ``name`` is present); is_self may be missing (then
    a ``self.<sub>`` domain means a self post); retrieved_on is ``retrieved_utc`` in newer dumps.
    """
    raw_id = rec.get("id") or rec.get("name")
    if not raw_id or not isinstance(raw_id, (str, int)):
        raise ValueError("no id")
    post_id = str(raw_id)
    if post_id.startswith("t3_"):
        post_id = post_id[3:]
    if not re.fullmatch(r"[0-9a-z]+", post_id):
        raise ValueError(f"bad id {post_id[:40]!r}")
    created = _as_int(rec.get("created_utc"))
    if created is None:
        created = _as_int(rec.get("created"))
    if created is None:
        raise ValueError("no created_utc")
    score = _as_int(rec.get("score"))
    if score is None:
        score = _as_int(rec.get("ups"))
    score = 0 if score is None else score
    sub = _str(rec.get("subreddit"))
    url = _str(rec.get("url")).strip()
    domain = _str(rec.get("domain")).strip()
    if not domain and url:
        m = re.match(r"^[a-z][a-z0-9+.-]*://([^/?#:]+)", url, re.IGNORECASE)
        domain = m.group(1).lower() if m else ""
    is_self = _as_bool(rec.get("is_self"))
    if is_self is None:
        is_self = domain.lower().startswith("self.")
    retrieved = _as_int(rec.get("retrieved_on"))
    if retrieved is None:
        retrieved = _as_int(rec.get("retrieved_utc"))
    author = rec.get("author")
    removed = rec.get("removed_by_category")
    return {
        "id": post_id,
        "subreddit": sub,
        "author": "[deleted]" if author is None else str(author),
        "created_utc": created,
        "title": _str(rec.get("title")),
        "selftext": _str(rec.get("selftext")),
        "url": url,
        "domain": domain,
        "is_self": is_self,
        "permalink": _str(rec.get("permalink")) or f"/r/{sub}/comments/{post_id}/",
        "num_comments": _as_int(rec.get("num_comments")) or 0,
        "over_18": bool(_as_bool(rec.get("over_18"))),
        "score": score,
        "retrieved_on": retrieved,
        # Only its truth is used; a non-string value (never seen in the data) is not kept as is.
        "removed_by_category": None if not removed else removed if isinstance(removed, str) else "other",
    }


def filter_reason(post: dict, config: RedditConfig) -> str | None:
    """Why a normalized submission is not a candidate (None: it is). First failing rule wins.

    Removal: ``removed_by_category`` set, or selftext "[removed]" (a link post's selftext is
    empty unless removed). Author "[deleted]" alone is kept: the user left, the post stayed.
    Gallery links (``/gallery/``, ``/t/<tag>/``) are ``gallery`` unless ``config.galleries``.
    Applied to the latest copy of a post (see ``pick_latest``): copies differ in removal.
    """
    if post["subreddit"].lower() != config.subreddit:
        return "subreddit"
    if not config.start_utc <= post["created_utc"] < config.end_utc:
        return "date"
    if post["is_self"]:
        return "self"
    parsed = parse_album_url(post["url"])
    if parsed is None:
        return "not_album"
    if parsed[0] != "a" and not config.galleries:
        return "gallery"
    if post["removed_by_category"] or post["selftext"].strip() == "[removed]":
        return "removed"
    return None


def candidate(post: dict) -> dict:
    """The output record (POST_KEYS) of a normalized submission that passed the filters."""
    kind, album = parse_album_url(post["url"])  # type: ignore[misc]  # checked by filter_reason
    out = {k: post[k] for k in POST_KEYS if k in post}
    out.update(dump_score=post["score"], score_refreshed=False, album_id=album, album_kind=kind)
    return out


class ParseSubmissions(beam.DoFn):
    """``(file, line number, bytes)`` -> every copy of the subreddit's submissions, normalized.

    Only the subreddit is checked here (monthly dumps hold all of Reddit); the other filters
    run on the latest copy of each post after the dedupe (``FilterCandidates``), since copies
    differ (a post removed after an early dump was taken).
    """

    def __init__(self, config: RedditConfig):
        self.config = config
        # Monthly dumps hold every subreddit; a line that does not even contain the quoted
        # name cannot be a post of it, and skipping json.loads for it is most of the speed-up.
        self._needle = f'"{config.subreddit}"'.encode()

    def process(self, item: tuple[str, int, bytes]):
        name, n, raw = item
        where = f"{name}:{n}"
        if self._needle not in raw.lower():
            count("posts_filtered_subreddit")
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield dead_letter("line", where, "not_utf8", str(exc))
            return
        try:
            rec = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than Python's stack
            yield dead_letter("line", where, "malformed_json", f"{type(exc).__name__}: {exc}; {text[:120]}")
            return
        if not isinstance(rec, dict):
            yield dead_letter("line", where, "malformed_json", f"not an object: {text[:120]}")
            return
        rec = _repaired(rec)
        try:
            post = normalize_submission(rec)
        except (ValueError, RecursionError) as exc:
            yield dead_letter("line", where, "malformed_submission", f"{exc}; {text[:120]}")
            return
        count("submissions_parsed")
        if post["subreddit"].lower() != self.config.subreddit:
            count("posts_filtered_subreddit")
            return
        if post["is_self"]:
            # Never read again (a self post is filtered as "self" before its text is looked
            # at); dropping it keeps long self texts out of the shuffle.
            post["selftext"] = ""
        yield post


class FilterCandidates(beam.DoFn):
    """The latest copy of each post -> candidate records (``POST_KEYS``); drops counted per reason."""

    def __init__(self, config: RedditConfig):
        self.config = config

    def process(self, post: dict):
        reason = filter_reason(post, self.config)
        if reason is not None:
            count(f"posts_filtered_{reason}")
            return
        count("posts_candidates")
        yield candidate(post)


def pick_latest(post_id: str, versions: Iterable[dict]) -> dict:
    """The copy of a post retrieved last (dumps overlap with each other and with the crawl).

    Runs on every normalized copy before the filters, so a post removed after an earlier dump
    was taken is judged by its latest (removed) copy.

    Ties (or no retrieved_on) go to the higher score, then to the canonical JSON, so the result
    does not depend on the order in which Beam delivers the copies.
    """
    versions = list(versions)
    if len(versions) > 1:
        count("duplicate_posts", len(versions) - 1)

    def key(p: dict):
        r = p.get("retrieved_on")
        return (-1 if r is None else r, p["score"], json.dumps(p, sort_keys=True, default=str))

    return max(versions, key=key)


# ---------------------------------------------------------------------------------------------
# Score refresh


def _api_errors() -> tuple[type[BaseException], ...]:
    import praw.exceptions
    import prawcore.exceptions

    return (prawcore.exceptions.PrawcoreException, praw.exceptions.PRAWException)


class RefreshScores(beam.DoFn):
    """Batches of up to 100 posts -> the same posts with current scores from ``/api/info``.

    Posts the API does not return (deleted since) keep their dump score with
    ``score_refreshed=False``. When a batch's call fails after prawcore's own retries, the build
    goes on (counted ``score_refresh_failed``): its posts whose dump score reaches ``min_score``
    keep it; the others are not silently filtered on a stale score but dead-lettered
    (``post:score_refresh_failed``, with the post id): a rerun with working API access would
    reconsider them. Without refreshing at all (``refresh_scores=false``, or ``auto`` without
    credentials) dump scores are used as they are (``scores_not_refreshed``).
    """

    def __init__(self, config: RedditConfig):
        self.config = config
        self._reddit = None

    def setup(self):
        self._reddit = None
        self._errors = ()
        if self.config.refresh == "false":
            return
        if self.config.refresh == "auto" and missing_credentials():
            return
        self._reddit = make_reddit(self.config.api_base)  # "true" + no credentials: clear error
        self._errors = _api_errors()

    def process(self, batch: list[dict]):
        if self._reddit is None:
            count("scores_not_refreshed", len(batch))
            yield from batch
            return
        fullnames = [f"t3_{p['id']}" for p in batch]
        try:
            fresh = {}
            for item in self._reddit.info(fullnames=fullnames):
                score = _as_int(getattr(item, "score", None))
                if score is not None:
                    fresh[str(item.id)] = score
        except self._errors as exc:
            count("score_refresh_failed", len(batch))
            log.warning("score refresh failed for %d posts: %s", len(batch), type(exc).__name__)
            for post in batch:
                if post["score"] >= self.config.min_score:
                    yield post
                else:
                    yield dead_letter(
                        "post",
                        post["id"],
                        "score_refresh_failed",
                        f"dump score {post['score']} < min_score {self.config.min_score} and the API "
                        f"call failed ({type(exc).__name__}); a rerun with API access reconsiders it",
                    )
            return
        for post in batch:
            if post["id"] in fresh:
                count("scores_refreshed")
                yield {**post, "score": fresh[post["id"]], "score_refreshed": True}
            else:
                count("scores_not_returned")
                yield {**post, "score_refreshed": False}

    def teardown(self):
        self._reddit = None


class _KeepScore(beam.DoFn):
    def __init__(self, min_score: int):
        self.min_score = min_score

    def process(self, post: dict):
        if post["score"] < self.min_score:
            count("posts_filtered_score")
            return
        count("posts_out")
        yield post


class ReadCandidatePosts(beam.PTransform):
    """Dump/incremental files under ``ctx.input`` -> candidate posts (dicts with ``POST_KEYS``).

    ``expand`` returns ``{"posts": PCollection[dict], "dead_letter": PCollection[DeadLetter]}``.
    Options are parsed (and ``refresh_scores=true`` checked against the environment) when the
    transform is built, so mistakes surface before the pipeline runs.
    """

    def __init__(self, ctx: SourceContext, *, read_size: int = READ_SIZE):
        super().__init__()
        self.ctx = ctx
        self.config = reddit_config(ctx)
        self.read_size = read_size

    def expand(self, pbegin):
        files = list_input_files(self.ctx.input, self.config)
        if not files:
            raise MmlinksError(
                f"no Reddit submission files under {self.ctx.input} for "
                f"{self.ctx.str('start')}..{self.ctx.str('end')} "
                f"(RS_YYYY-MM.zst, <sub>_submissions.zst, *.ndjson[.zst])"
            )
        lines = (
            pbegin
            | "Files" >> beam.Create(files)
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadFiles"
            >> beam.ParDo(ReadSubmissionFile(self.read_size)).with_outputs(DEAD_LETTER, main="lines")
        )
        parsed = lines.lines | "Parse" >> beam.ParDo(ParseSubmissions(self.config)).with_outputs(
            DEAD_LETTER, main="posts"
        )
        # Dedupe first, then filter the chosen copy: a later copy may be removed.
        refreshed = (
            parsed.posts
            | "KeyById" >> beam.Map(lambda p: (p["id"], p))
            | "GroupById" >> beam.GroupByKey()
            | "LatestCopy" >> beam.MapTuple(pick_latest)
            | "Filter" >> beam.ParDo(FilterCandidates(self.config))
            | "Batch" >> beam.BatchElements(min_batch_size=INFO_BATCH, max_batch_size=INFO_BATCH)
            | "RefreshScores"
            >> beam.ParDo(RefreshScores(self.config)).with_outputs(DEAD_LETTER, main="posts")
        )
        posts = refreshed.posts | "MinScore" >> beam.ParDo(_KeepScore(self.config.min_score))
        dead = (lines[DEAD_LETTER], parsed[DEAD_LETTER], refreshed[DEAD_LETTER]) | "DeadLetters" >> (
            beam.Flatten()
        )
        return {"posts": posts, DEAD_LETTER: dead}


# ---------------------------------------------------------------------------------------------
# Incremental crawl


def _json_value(value: Any) -> Any:
    """A praw attribute as plain JSON (praw objects -> their name), or raise TypeError."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    raise TypeError(type(value).__name__)


_PRAW_ATTRIBUTES = {"comment_limit", "comment_sort"}  # praw's own settings, not Reddit's data


def submission_record(submission: Any, retrieved_on: int) -> dict:
    """A praw Submission as a dump line: the same field names, plain JSON values."""
    data = {}
    for key, value in vars(submission).items():
        if key.startswith("_") or key in _PRAW_ATTRIBUTES:
            continue
        if key == "author":
            value = "[deleted]" if value is None else str(value)
        elif key == "subreddit":
            value = str(getattr(value, "display_name", value))
        try:
            data[key] = _json_value(value)
        except TypeError:
            continue  # praw objects without a plain form (poll data, ...): not dump fields
    data["id"] = str(submission.id)
    data.setdefault("name", f"t3_{data['id']}")
    created = _as_int(data.get("created_utc"))
    if created is None:
        raise ValueError(f"submission {data['id']} has no created_utc")
    data["created_utc"] = created
    data["retrieved_on"] = retrieved_on
    data.setdefault("removed_by_category", None)
    for f in DUMP_FIELDS:
        data.setdefault(f, None)
    return data


def _compress_ndjson(records: list[dict]) -> bytes:
    body = b"".join(
        json.dumps(r, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode() + b"\n"
        for r in records
    )
    return zstandard.ZstdCompressor(level=10).compress(body)


def _recent_from_cursor(cursor: dict, newest: int | None) -> dict[str, int]:
    """The cursor's remembered ids as ``{id: created_utc}``.

    Cursors written before the overlap window hold a plain list of ids: they count as created
    at the checkpoint (kept for one more window).
    """
    raw = cursor.get("recent_ids")
    fallback = 0 if newest is None else newest
    if isinstance(raw, dict):
        out = {}
        for key, value in raw.items():
            created = _as_int(value)
            out[str(key)] = fallback if created is None else created
        return out
    if isinstance(raw, list):
        return {str(i): fallback for i in raw if isinstance(i, (str, int))}
    return {}


def _iso(ts: int | None) -> str:
    return "?" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def crawl_new_posts(
    state: CrawlState,
    out_dir: str,
    *,
    subreddit: str = "DIY",
    reddit=None,
    limit: int | None = None,
    now: float | None = None,
    overlap_s: int = DEFAULT_OVERLAP_S,
) -> dict:
    """Fetch the posts not seen by earlier runs from ``/r/<sub>/new`` into dump-format files.

    The cursor ``reddit-new-<sub>`` holds the checkpoint (the newest created_utc and id of a
    run that read down to the previous checkpoint) and the ids already fetched with their
    creation times. The listing is read newest-first past the checkpoint for ``overlap_s``
    more seconds of creation time, since posts approved late (mod queue, spam filter) appear
    at their original time, below newer ones; ids already fetched are skipped. Ids are kept
    for the overlap window (and past a gap, see below), at most ``RECENT_IDS_KEPT``.

    New posts are written as one zstd ndjson file per run and creation month, ``out_dir/
    <YYYY-MM>/<sub>_incremental_<UTC time>.ndjson.zst`` (so monthly partitions line up with
    the dumps), atomically; only then does the cursor move. A crash before the cursor moves
    redoes the run, writing a second file with the same posts; ``ReadCandidatePosts``
    de-duplicates by id.

    Gaps: when the run stops before the checkpoint, posts between it and the oldest post read
    were not fetched (``gap_possible``, with ``gap`` = ``{"after_utc", "before_utc",
    "checkpoint_kept"}``). Stopped by ``limit``: the checkpoint stays where it was and the
    fetched ids are remembered, so a later run without the limit reads down to it again and
    fetches only the rest. The listing itself ended (Reddit keeps about ``LISTING_LIMIT``
    posts and has no time-range search; more arrived since the last run): the posts below can
    never be listed again, so the checkpoint moves on and the range is recorded in the
    cursor's ``gaps`` for a backfill from the dumps. Run this at least as often as 1000 posts
    arrive in the subreddit (r/DIY: a few days).

    Scores in these files are minutes old; the reader's score refresh updates them. Returns
    ``{"new_posts", "files", "cursor" (without its id list), "listed", "duplicates_skipped",
    "malformed_skipped", "reached_checkpoint", "overlap_complete", "gap_possible", "gap"}``.
    API errors propagate (after prawcore's retries) before the cursor moves, so the next run
    simply starts over.
    """
    if isinstance(overlap_s, bool) or not isinstance(overlap_s, int) or overlap_s < 0:
        raise MmlinksError(f"the crawl overlap wants a whole number of seconds >= 0, not {overlap_s!r}")
    if limit is not None and limit < 1:
        raise MmlinksError(f"the crawl limit wants a positive number of posts, not {limit!r}")
    now = time.time() if now is None else now
    reddit = make_reddit() if reddit is None else reddit
    name = f"reddit-new-{subreddit.lower()}"
    cursor = state.cursor(name) or {}
    newest = _as_int(cursor.get("newest_created_utc"))
    newest_id = cursor.get("newest_id")
    recent = _recent_from_cursor(cursor, newest)
    stop_below = None if newest is None else newest - overlap_s

    fresh: dict[str, dict] = {}
    duplicates = malformed = listed = 0
    reached = overlap_complete = False
    top = top_id = oldest = None  # creation times (and the top's id) of what was listed
    for submission in reddit.subreddit(subreddit).new(limit=limit):
        listed += 1
        post_id = str(submission.id)
        created = _as_int(getattr(submission, "created_utc", None))
        if newest is not None and (post_id == newest_id or (created is not None and created <= newest)):
            reached = True  # everything newer than the checkpoint has been listed
        if stop_below is not None and created is not None and created < stop_below:
            overlap_complete = True
            break
        if created is not None:
            if top is None or created > top:
                top, top_id = created, post_id
            oldest = created if oldest is None else min(oldest, created)
        if post_id in recent or post_id in fresh:
            duplicates += 1
            continue
        try:
            fresh[post_id] = submission_record(submission, int(now))
        except ValueError as exc:  # no usable created_utc: nothing to file it under
            malformed += 1
            log.warning("r/%s: skipping submission %s: %s", subreddit, post_id, exc)

    limited = limit is not None and listed >= limit
    gap = newest is not None and not reached
    gap_info = None
    if gap:
        gap_info = {"after_utc": newest, "before_utc": oldest, "checkpoint_kept": limited}
        if limited:
            log.warning(
                "r/%s: stopped after the limit of %d posts before the last checkpoint: posts created "
                "between %s and %s are not fetched yet; the checkpoint stays, a run without the "
                "limit fetches them",
                subreddit,
                listed,
                _iso(newest),
                _iso(oldest),
            )
        else:
            log.warning(
                "r/%s: the listing ended (%d posts; Reddit lists about %d) before the last checkpoint: "
                "posts created between %s and %s may be missing (backfill them from the dumps; "
                "crawl more often)",
                subreddit,
                listed,
                LISTING_LIMIT,
                _iso(newest),
                _iso(oldest),
            )

    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    by_month: dict[str, list[dict]] = {}
    for rec in fresh.values():
        month = datetime.fromtimestamp(rec["created_utc"], UTC).strftime("%Y-%m")
        by_month.setdefault(month, []).append(rec)
    files = []
    for month, records in sorted(by_month.items()):
        records.sort(key=lambda r: (r["created_utc"], r["id"]))
        uri = fileio.join(out_dir, month, f"{subreddit}_incremental_{stamp}.ndjson.zst")
        fileio.write_bytes_atomic(uri, _compress_ndjson(records))
        files.append(uri)

    # The checkpoint moves to the newest post listed, unless a limit stopped the run short of
    # the old one (then the gap below must still be read: the old checkpoint stays).
    mark, mark_id = newest, newest_id
    if top is not None and (newest is None or top > newest) and not (gap and limited):
        mark, mark_id = top, top_id
    for rec in fresh.values():
        recent[rec["id"]] = rec["created_utc"]
    keep_from = None if mark is None else mark - overlap_s
    kept = sorted(((c, i) for i, c in recent.items() if keep_from is None or c >= keep_from), reverse=True)
    gaps = [g for g in cursor.get("gaps") or [] if isinstance(g, list)]
    if gap and not limited and oldest is not None:
        gaps = [*gaps, [newest, oldest]][-GAPS_KEPT:]
    new_cursor: dict[str, Any] = {
        "newest_created_utc": mark,
        "newest_id": mark_id,
        "recent_ids": {i: c for c, i in kept[:RECENT_IDS_KEPT]},
    }
    if gaps:
        new_cursor["gaps"] = gaps
    if mark is not None and new_cursor != {k: v for k, v in cursor.items() if k != "updated_at"}:
        new_cursor["updated_at"] = stamp
        state.set_cursor(name, new_cursor)  # after the files: a crash before here redoes the run
        cursor = new_cursor
    count_new = len(fresh)
    log.info("r/%s: %d new posts in %d file(s)", subreddit, count_new, len(files))
    summary = {k: v for k, v in cursor.items() if k != "recent_ids"}
    summary["recent_ids_kept"] = len(cursor.get("recent_ids") or ())
    return {
        "new_posts": count_new,
        "files": files,
        "cursor": summary,
        "listed": listed,
        "duplicates_skipped": duplicates,
        "malformed_skipped": malformed,
        "reached_checkpoint": reached,
        "overlap_complete": overlap_complete,
        "gap_possible": gap,
        "gap": gap_info,
    }


__all__ = [
    "DEFAULT_OVERLAP_S",
    "DUMP_FIELDS",
    "POST_KEYS",
    "REDDIT_CREDENTIALS",
    "REDDIT_OPTIONS",
    "ReadCandidatePosts",
    "RedditConfig",
    "album_of",
    "crawl_new_posts",
    "filter_reason",
    "list_input_files",
    "make_reddit",
    "normalize_submission",
    "reddit_config",
    "require_credentials",
]
