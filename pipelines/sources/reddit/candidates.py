"""``ReadCandidatePosts``: submission files -> de-duplicated, filtered, score-refreshed posts.

Dump scores were taken minutes to days after posting and can be far too low, so the scores
of the candidates are refreshed through the API (100 ids per call) before the score filter.
"""

from __future__ import annotations

import logging
import time

import apache_beam as beam

from pipelines.records import DEAD_LETTER, count, dead_letter, dead_lettered
from pipelines.sources.base import SourceContext
from pipelines.sources.reddit.api import api_errors, make_reddit, missing_credentials
from pipelines.sources.reddit.config import INFO_BATCH, READ_SIZE, RedditConfig, reddit_config
from pipelines.sources.reddit.dumps import ReadSubmissionFile, list_input_files
from pipelines.sources.reddit.normalise import FilterCandidates, ParseSubmissions, as_int, pick_latest
from schemas.errors import MmlinksError

log = logging.getLogger(__name__)


SCORES_KIND = "reddit_scores"  # crawl-state records: post id -> {"score": n} or {"missing": true}, "at": t
# A checkpointed score is reused when it was taken once the post's score had settled (this long
# after the post was created), or recently enough to be a rerun of an interrupted build; else the
# API is asked again (a weekly rebuild must not keep a new post's first-day score forever).
SCORE_SETTLED_S = 30 * 86400
SCORE_RERUN_S = 86400


class RefreshScores(beam.DoFn):
    """Batches of up to 100 posts -> the same posts with current scores from ``/api/info``
    (docs/sources.md, "Score refresh").

    Posts the API does not return (deleted since) keep their dump score with
    ``score_refreshed=False``. A batch whose call fails after prawcore's retries does not filter on
    stale scores: its posts under ``min_score`` become ``post:score_refresh_failed`` dead letters,
    which a rerun with working API access reconsiders. Each answer is checkpointed per post in the
    crawl state before the batch moves on (``scores_from_checkpoint`` on a rerun); scores taken
    before a post's score settled (``SCORE_SETTLED_S``) are asked for again; failed calls are not
    recorded.
    """

    def __init__(self, config: RedditConfig, state_root: str | None = None):
        self.config = config
        self.state_root = state_root
        self._reddit = None

    def setup(self):
        from pipelines.crawl_state import CrawlState

        self._reddit = None
        self._errors = ()
        self._state = CrawlState(self.state_root) if self.state_root else None
        if self.config.refresh == "false":
            return
        if self.config.refresh == "auto" and missing_credentials():
            return
        self._reddit = make_reddit(self.config.api_base)  # "true" + no credentials: clear error
        self._errors = api_errors()

    def _checkpointed(self, batch: list[dict]) -> dict[str, dict]:
        """Checkpointed answers still good to use (see ``SCORE_SETTLED_S``), by post id."""
        if self._state is None:
            return {}
        now, out = time.time(), {}
        for post in batch:
            rec = self._state.get(SCORES_KIND, post["id"])
            at = rec.get("at") if rec else None
            if isinstance(at, int | float) and (
                at - post["created_utc"] >= SCORE_SETTLED_S or now - at < SCORE_RERUN_S
            ):
                out[post["id"]] = rec
        return out

    def _ask(self, posts: list[dict]) -> dict[str, int]:
        """Current scores of ``posts`` from the API, checkpointed (raises the API's errors)."""
        fresh: dict[str, int] = {}
        if not posts:
            return fresh
        for item in self._reddit.info(fullnames=[f"t3_{p['id']}" for p in posts]):
            score = as_int(getattr(item, "score", None))
            if score is not None:
                fresh[str(item.id)] = score
        if self._state is not None:
            at = int(time.time())
            for p in posts:
                record = {"score": fresh[p["id"]]} if p["id"] in fresh else {"missing": True}
                self._state.put(SCORES_KIND, p["id"], {**record, "at": at})
        return fresh

    def process(self, batch: list[dict]):
        if self._reddit is None:
            count("scores_not_refreshed", len(batch))
            yield from batch
            return
        known = self._checkpointed(batch)
        if known:
            count("scores_from_checkpoint", len(known))
        try:
            fresh = self._ask([p for p in batch if p["id"] not in known])
        except self._errors as exc:
            count("score_refresh_failed", len(batch) - len(known))
            log.warning("score refresh failed for %d posts: %s", len(batch) - len(known), type(exc).__name__)
            yield from self._failed([p for p in batch if p["id"] not in known], exc)
            fresh = {}
            batch = [p for p in batch if p["id"] in known]
        fresh.update({k: v["score"] for k, v in known.items() if "score" in v})
        for post in batch:
            if post["id"] in fresh:
                count("scores_refreshed")
                yield {**post, "score": fresh[post["id"]], "score_refreshed": True}
            else:
                count("scores_not_returned")
                yield {**post, "score_refreshed": False}

    def _failed(self, posts: list[dict], exc: Exception):
        for post in posts:
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
        log.info("taking %d files as Reddit submission dumps: %s", len(files), ", ".join(files))
        lines = (
            pbegin
            | "Files" >> beam.Create(files)
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadFiles" >> dead_lettered(ReadSubmissionFile(self.read_size), "lines")
        )
        parsed = lines.lines | "Parse" >> dead_lettered(ParseSubmissions(self.config), "posts")
        # Dedupe first, then filter the chosen copy: a later copy may be removed.
        refreshed = (
            parsed.posts
            | "KeyById" >> beam.Map(lambda p: (p["id"], p))
            | "GroupById" >> beam.GroupByKey()
            | "LatestCopy" >> beam.MapTuple(pick_latest)
            | "Filter" >> beam.ParDo(FilterCandidates(self.config))
            | "Batch" >> beam.BatchElements(min_batch_size=INFO_BATCH, max_batch_size=INFO_BATCH)
            | "RefreshScores" >> dead_lettered(RefreshScores(self.config, self.ctx.state()), "posts")
        )
        posts = refreshed.posts | "MinScore" >> beam.ParDo(_KeepScore(self.config.min_score))
        dead = (lines[DEAD_LETTER], parsed[DEAD_LETTER], refreshed[DEAD_LETTER]) | "DeadLetters" >> (
            beam.Flatten()
        )
        return {"posts": posts, DEAD_LETTER: dead}
