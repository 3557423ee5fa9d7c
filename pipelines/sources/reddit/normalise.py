"""One submission line -> a normalised post, the paper's filters, and the latest copy of a post."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import apache_beam as beam

from pipelines.records import count, dead_letter
from pipelines.sources.imgur import parse_album_url
from pipelines.sources.jsonstream import repaired as _repaired
from pipelines.sources.reddit.config import POST_KEYS, RedditConfig


def as_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return None


def as_bool(value: Any) -> bool | None:
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
    created = as_int(rec.get("created_utc"))
    if created is None:
        created = as_int(rec.get("created"))
    if created is None:
        raise ValueError("no created_utc")
    score = as_int(rec.get("score"))
    if score is None:
        score = as_int(rec.get("ups"))
    score = 0 if score is None else score
    sub = _str(rec.get("subreddit"))
    url = _str(rec.get("url")).strip()
    domain = _str(rec.get("domain")).strip()
    if not domain and url:
        m = re.match(r"^[a-z][a-z0-9+.-]*://([^/?#:]+)", url, re.IGNORECASE)
        domain = m.group(1).lower() if m else ""
    is_self = as_bool(rec.get("is_self"))
    if is_self is None:
        is_self = domain.lower().startswith("self.")
    retrieved = as_int(rec.get("retrieved_on"))
    if retrieved is None:
        retrieved = as_int(rec.get("retrieved_utc"))
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
        "num_comments": as_int(rec.get("num_comments")) or 0,
        "over_18": bool(as_bool(rec.get("over_18"))),
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
