"""The incremental crawl of ``/r/<sub>/new`` with praw, checkpointed in a ``CrawlState`` cursor,
written in the dump format so the same reader takes both. :func:`run_crawl` builds the client
from the environment (one-line errors); :func:`crawl_new_posts` takes a ready one (tests)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import zstandard

from pipelines import fileio
from pipelines.crawl_state import CrawlState
from pipelines.sources.reddit.api import api_error, api_errors, make_reddit
from pipelines.sources.reddit.config import (
    DEFAULT_OVERLAP_S,
    DUMP_FIELDS,
    GAPS_KEPT,
    LISTING_LIMIT,
    RECENT_IDS_KEPT,
)
from pipelines.sources.reddit.normalise import as_int
from schemas.errors import MmlinksError

log = logging.getLogger(__name__)


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
    created = as_int(data.get("created_utc"))
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
            created = as_int(value)
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
    """Fetch the posts not seen by earlier runs from ``/r/<sub>/new`` into dump-format files
    (docs/sources.md, "Incremental crawl").

    The cursor ``reddit-new-<sub>`` holds the checkpoint (the newest created_utc and id of a run
    that read down to the previous one) and the ids already fetched, kept for the overlap window
    (and past a gap), at most ``RECENT_IDS_KEPT``. The listing is read ``overlap_s`` past the
    checkpoint because posts approved late appear at their original time, below newer ones. Files
    (``out_dir/<YYYY-MM>/<sub>_incremental_<UTC time>.ndjson.zst``, lined up with the dumps'
    months) are written atomically before the cursor moves, so a crash only repeats work, which
    ``ReadCandidatePosts`` de-duplicates by id. Stopped by ``limit``, the checkpoint stays and a
    later run fetches only the rest; the listing itself ending (Reddit keeps about
    ``LISTING_LIMIT`` posts) moves the checkpoint on and records the range in the cursor's
    ``gaps`` for a backfill from the dumps. API errors propagate before the cursor moves.
    Returns ``{"new_posts", "files", "cursor" (without its id list), "listed",
    "duplicates_skipped", "malformed_skipped", "reached_checkpoint", "overlap_complete",
    "gap_possible", "gap"}``.
    """
    if isinstance(overlap_s, bool) or not isinstance(overlap_s, int) or overlap_s < 0:
        raise MmlinksError(f"the crawl overlap wants a whole number of seconds >= 0, not {overlap_s!r}")
    if limit is not None and limit < 1:
        raise MmlinksError(f"the crawl limit wants a positive number of posts, not {limit!r}")
    now = time.time() if now is None else now
    reddit = make_reddit() if reddit is None else reddit
    name = f"reddit-new-{subreddit.lower()}"
    cursor = state.cursor(name) or {}
    newest = as_int(cursor.get("newest_created_utc"))
    newest_id = cursor.get("newest_id")
    recent = _recent_from_cursor(cursor, newest)
    stop_below = None if newest is None else newest - overlap_s

    listing = reddit.subreddit(subreddit).new(limit=limit)
    run = _read_listing(listing, subreddit, newest, newest_id, stop_below, recent, int(now))
    limited = limit is not None and run.listed >= limit
    gap = newest is not None and not run.reached
    gap_info = None
    if gap:
        gap_info = {"after_utc": newest, "before_utc": run.oldest, "checkpoint_kept": limited}
        _warn_gap(subreddit, run.listed, newest, run.oldest, limited)

    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    files = _write_month_files(run.fresh, out_dir, subreddit, stamp)

    new_cursor = _next_cursor(cursor, run, newest, newest_id, recent, overlap_s, gap, limited)
    if new_cursor["newest_created_utc"] is not None and new_cursor != {
        k: v for k, v in cursor.items() if k != "updated_at"
    }:
        new_cursor["updated_at"] = stamp
        state.set_cursor(name, new_cursor)  # after the files: a crash before here redoes the run
        cursor = new_cursor
    log.info("r/%s: %d new posts in %d file(s)", subreddit, len(run.fresh), len(files))
    return _crawl_summary(run, files, cursor, gap, gap_info)


def _crawl_summary(run, files: list[str], cursor: dict, gap: bool, gap_info: dict | None) -> dict:
    """What ``crawl_new_posts`` returns: counts, files and the cursor without its id list."""
    summary = {k: v for k, v in cursor.items() if k != "recent_ids"}
    summary["recent_ids_kept"] = len(cursor.get("recent_ids") or ())
    return {
        "new_posts": len(run.fresh),
        "files": files,
        "cursor": summary,
        "listed": run.listed,
        "duplicates_skipped": run.duplicates,
        "malformed_skipped": run.malformed,
        "reached_checkpoint": run.reached,
        "overlap_complete": run.overlap_complete,
        "gap_possible": gap,
        "gap": gap_info,
    }


@dataclass
class _ListingRun:
    """What one pass down ``/new`` saw."""

    fresh: dict[str, dict] = field(default_factory=dict)  # id -> dump record of new posts
    listed: int = 0
    duplicates: int = 0
    malformed: int = 0
    reached: bool = False  # everything newer than the checkpoint has been listed
    overlap_complete: bool = False
    top: int | None = None  # creation time (and id) of the newest post listed
    top_id: str | None = None
    oldest: int | None = None  # creation time of the oldest post listed


def _read_listing(
    listing, subreddit: str, newest, newest_id, stop_below, recent: dict[str, int], retrieved_on: int
) -> _ListingRun:
    """Read the listing newest-first down to ``stop_below``, keeping posts not fetched before."""
    run = _ListingRun()
    for submission in listing:
        run.listed += 1
        post_id = str(submission.id)
        created = as_int(getattr(submission, "created_utc", None))
        if newest is not None and (post_id == newest_id or (created is not None and created <= newest)):
            run.reached = True
        if stop_below is not None and created is not None and created < stop_below:
            run.overlap_complete = True
            break
        if created is not None:
            if run.top is None or created > run.top:
                run.top, run.top_id = created, post_id
            run.oldest = created if run.oldest is None else min(run.oldest, created)
        if post_id in recent or post_id in run.fresh:
            run.duplicates += 1
            continue
        try:
            run.fresh[post_id] = submission_record(submission, retrieved_on)
        except ValueError as exc:  # no usable created_utc: nothing to file it under
            run.malformed += 1
            log.warning("r/%s: skipping submission %s: %s", subreddit, post_id, exc)
    return run


def _warn_gap(subreddit: str, listed: int, newest: int, oldest: int | None, limited: bool) -> None:
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


def _write_month_files(fresh: dict[str, dict], out_dir: str, subreddit: str, stamp: str) -> list[str]:
    """One zstd ndjson file per creation month, written atomically; their URIs."""
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
    return files


def _next_cursor(
    cursor: dict, run: _ListingRun, newest, newest_id, recent: dict[str, int], overlap_s: int, gap, limited
) -> dict[str, Any]:
    """The cursor after this run (without ``updated_at``); ``recent`` gains the fetched ids."""
    # The checkpoint moves to the newest post listed, unless a limit stopped the run short of
    # the old one (then the gap below must still be read: the old checkpoint stays).
    mark, mark_id = newest, newest_id
    if run.top is not None and (newest is None or run.top > newest) and not (gap and limited):
        mark, mark_id = run.top, run.top_id
    for rec in run.fresh.values():
        recent[rec["id"]] = rec["created_utc"]
    keep_from = None if mark is None else mark - overlap_s
    kept = sorted(((c, i) for i, c in recent.items() if keep_from is None or c >= keep_from), reverse=True)
    gaps = [g for g in cursor.get("gaps") or [] if isinstance(g, list)]
    if gap and not limited and run.oldest is not None:
        gaps = [*gaps, [newest, run.oldest]][-GAPS_KEPT:]
    new_cursor: dict[str, Any] = {
        "newest_created_utc": mark,
        "newest_id": mark_id,
        "recent_ids": {i: c for c, i in kept[:RECENT_IDS_KEPT]},
    }
    if gaps:
        new_cursor["gaps"] = gaps
    return new_cursor


def run_crawl(
    state_uri: str,
    out: str,
    *,
    subreddit: str = "DIY",
    limit: int | None = None,
    overlap_s: int | None = None,
    api_base: str | None = None,
) -> dict:
    """One incremental crawl run from the environment's credentials: ``crawl_new_posts``'s result.

    ``state_uri`` holds the crawl state (the cursor), ``out`` receives the dump-format files;
    ``overlap_s`` None means ``DEFAULT_OVERLAP_S``; ``api_base`` replaces Reddit's URLs
    (proxies, fixture servers). Missing credentials and API failures (after prawcore's
    retries) raise a one-line MmlinksError with the credentials scrubbed and a hint; the
    checkpoint has not moved then, so a rerun retries.
    """
    errors = api_errors()
    try:
        reddit = make_reddit(api_base)  # credentials from the environment, or one clear error
        return crawl_new_posts(
            CrawlState(state_uri),
            out,
            subreddit=subreddit,
            reddit=reddit,
            limit=limit,
            overlap_s=DEFAULT_OVERLAP_S if overlap_s is None else overlap_s,
        )
    except errors as exc:
        error = api_error(exc, f"the crawl of r/{subreddit}")
        raise MmlinksError(f"{error}; the checkpoint did not move, rerun to retry") from exc


def gap_warning(subreddit: str, result: dict) -> str | None:
    """The warning to show for a run that may have left a gap (``result`` of a crawl), else None."""
    if not result.get("gap_possible"):
        return None
    gap = result.get("gap") or {}

    def utc(ts) -> str:
        return "?" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")

    if gap.get("checkpoint_kept"):
        what = "a run without --limit fetches them (the checkpoint stays)"
    else:
        what = "the listing cannot reach them any more: backfill that range from the dumps"
    return (
        f"gap_possible: posts of r/{subreddit} created between "
        f"{utc(gap.get('after_utc'))} and {utc(gap.get('before_utc'))} may be missing; {what}"
    )
