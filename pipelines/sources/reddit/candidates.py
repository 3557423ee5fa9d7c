"""``ReadCandidatePosts``: submission files -> de-duplicated, filtered, score-refreshed posts.

Dump scores were taken minutes to days after posting and can be far too low, so the scores
of the candidates are refreshed through the API (100 ids per call) before the score filter.
"""

from __future__ import annotations

import logging

import apache_beam as beam

from pipelines.records import DEAD_LETTER, count, dead_letter
from pipelines.sources.base import SourceContext
from pipelines.sources.reddit.api import api_errors, make_reddit, missing_credentials
from pipelines.sources.reddit.config import INFO_BATCH, READ_SIZE, RedditConfig, reddit_config
from pipelines.sources.reddit.dumps import ReadSubmissionFile, list_input_files
from pipelines.sources.reddit.normalise import FilterCandidates, ParseSubmissions, as_int, pick_latest
from schemas.errors import MmlinksError

log = logging.getLogger(__name__)


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
        self._errors = api_errors()

    def process(self, batch: list[dict]):
        if self._reddit is None:
            count("scores_not_refreshed", len(batch))
            yield from batch
            return
        fullnames = [f"t3_{p['id']}" for p in batch]
        try:
            fresh = {}
            for item in self._reddit.info(fullnames=fullnames):
                score = as_int(getattr(item, "score", None))
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
