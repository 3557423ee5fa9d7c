"""Reddit submissions: dump reading, filters, dedupe, score refresh and the incremental crawl."""

from __future__ import annotations

import bz2
import calendar
import io
import itertools
import json
import logging
import lzma
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import apache_beam as beam
import prawcore.sessions
import pytest
import zstandard
from apache_beam.metrics.metric import MetricsFilter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines import fileio
from pipelines.crawl_state import CrawlState
from pipelines.direct_runner import DirectRunner
from pipelines.records import COUNTS_NAMESPACE, DEAD_LETTER, DROPPED_NAMESPACE
from pipelines.sources import reddit as rd
from pipelines.sources.base import SourceContext
from pipelines.sources.imgur import parse_album_url
from schemas.errors import MmlinksError
from tests.fixtures.reddit import BASE_UTC, RedditFixtureServer, read_dump, submission, write_dump

JAN_2015 = BASE_UTC  # 2015-01-01T00:00:00Z
SECRET_ID = "id-SHOULD-NOT-LEAK-7f3a"
SECRET = "secret-SHOULD-NOT-LEAK-91bc"


def ctx_for(input_uri, tmp_path: Path, **options: str) -> SourceContext:
    opts = {"refresh_scores": "false", "min_score": "0", **options}
    return SourceContext("diy", str(input_uri), opts, str(tmp_path / "state"), rd.REDDIT_OPTIONS)


def run_reader(ctx: SourceContext, tmp_path: Path, **kwargs):
    """Run ReadCandidatePosts; returns (posts by id, dead letters, counters by name)."""
    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
    p = beam.Pipeline(runner=DirectRunner())
    res = p | rd.ReadCandidatePosts(ctx, **kwargs)
    assert set(res) == {"posts", DEAD_LETTER}
    (
        res["posts"]
        | "PostJson" >> beam.Map(lambda d: json.dumps(d, sort_keys=True))
        | "WritePosts" >> beam.io.WriteToText(str(out / "posts"), shard_name_template="", num_shards=1)
    )
    (
        res[DEAD_LETTER]
        | "DeadJson" >> beam.Map(lambda d: d.to_json())
        | "WriteDead" >> beam.io.WriteToText(str(out / "dead"), shard_name_template="", num_shards=1)
    )
    result = p.run()
    result.wait_until_finish()
    posts = [json.loads(line) for line in (out / "posts").read_text().splitlines()]
    dead = [json.loads(line) for line in (out / "dead").read_text().splitlines()]
    counters: dict[str, int] = {}
    for ns in (COUNTS_NAMESPACE, DROPPED_NAMESPACE):
        for c in result.metrics().query(MetricsFilter().with_namespace(ns))["counters"]:
            value = c.committed if c.committed is not None else c.attempted
            counters[c.key.metric.name] = counters.get(c.key.metric.name, 0) + int(value)
    by_id = {}
    for post in posts:
        assert post["id"] not in by_id, f"duplicate post {post['id']}"
        assert set(post) == set(rd.POST_KEYS)
        by_id[post["id"]] = post
    return by_id, dead, counters


@pytest.fixture
def no_retry_sleep(monkeypatch):
    """prawcore sleeps 2-4 s before retrying a 5xx; the retries still happen, instantly."""
    monkeypatch.setattr(prawcore.sessions.FiniteRetryStrategy, "_sleep_seconds", lambda self: None)


@pytest.fixture
def creds(monkeypatch):
    monkeypatch.setenv("praw_client_id", SECRET_ID)
    monkeypatch.setenv("praw_client_secret", SECRET)
    monkeypatch.setenv("praw_user_agent", "linux:mmlinks-tests:0.1 (by u/nobody)")


@pytest.fixture
def no_creds(monkeypatch):
    for name in rd.REDDIT_CREDENTIALS:
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------------------------------------
# Reading files


def test_reads_monthly_per_subreddit_and_incremental_files(tmp_path, no_creds):
    other = [submission(f"o{i}", subreddit="woodworking") for i in range(5)]
    diy = [submission(f"m{i}", created_utc=JAN_2015 + 1000 * i) for i in range(40)]
    # A monthly dump of every subreddit: several frames and a 256 MiB window (above zstd's
    # default decoder limit), as the archive's files are.
    write_dump(tmp_path / "in" / "RS_2015-01.zst", diy[:30] + other, frames=3, window_log=28)
    write_dump(tmp_path / "in" / "subreddits" / "DIY_submissions.zst", diy[30:35])
    write_dump(tmp_path / "in" / "inc" / "2015-01" / "DIY_incremental_x.ndjson", diy[35:])
    # Left alone: comments, other formats, a monthly dump outside [start, end].
    write_dump(tmp_path / "in" / "RC_2015-01.zst", [submission("c1")])
    (tmp_path / "in" / "README.txt").write_text("not data")
    write_dump(tmp_path / "in" / "RS_2019-01.zst", [submission("late", created_utc=JAN_2015)])

    with pytest.raises(zstandard.ZstdError):  # the window really needs max_window_size
        zstandard.ZstdDecompressor().stream_reader((tmp_path / "in" / "RS_2015-01.zst").read_bytes()).read()

    ctx = ctx_for(tmp_path / "in", tmp_path)
    files = rd.list_input_files(ctx.input, rd.reddit_config(ctx))
    assert sorted(Path(f).name for f in files) == [
        "DIY_incremental_x.ndjson",
        "DIY_submissions.zst",
        "RS_2015-01.zst",
    ]
    posts, dead, counters = run_reader(ctx, tmp_path)
    assert set(posts) == {r["id"] for r in diy}
    assert dead == []
    assert counters["posts_filtered_subreddit"] == 5
    assert counters["scores_not_refreshed"] == 40
    p = posts["m3"]
    assert p["album_id"] == "Albm3" and p["album_kind"] == "a"
    assert p["created_utc"] == JAN_2015 + 3000 and p["score"] == p["dump_score"] == 120
    assert p["score_refreshed"] is False and p["subreddit"] == "DIY"
    # A single file and a glob work as inputs too.
    assert rd.list_input_files(str(tmp_path / "in" / "RS_2015-01.zst")) == [
        str(tmp_path / "in" / "RS_2015-01.zst")
    ]
    assert len(rd.list_input_files(str(tmp_path / "in" / "*.zst"), rd.reddit_config(ctx))) == 1
    with pytest.raises(MmlinksError, match="does not exist"):
        rd.list_input_files(str(tmp_path / "nope"))


@pytest.mark.parametrize("name", ["DIY_submissions.zst", "DIY_incremental.ndjson"])
def test_multibyte_characters_across_read_chunks(tmp_path, name, no_creds):
    titles = [f"Bücherregal aus Eiche – {i} 🔨🪚 ünïcødé {'é' * i}" for i in range(12)]
    recs = [submission(f"u{i}", title=t, created_utc=JAN_2015 + i) for i, t in enumerate(titles)]
    write_dump(tmp_path / "in" / name, recs)
    # 7-byte reads: every multi-byte character lands across a chunk boundary somewhere.
    posts, dead, _ = run_reader(ctx_for(tmp_path / "in", tmp_path), tmp_path, read_size=7)
    assert dead == []
    assert {p["id"]: p["title"] for p in posts.values()} == {f"u{i}": t for i, t in enumerate(titles)}


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(
        st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=30),
        min_size=1,
        max_size=12,
    ),
    cuts=st.lists(st.integers(0, 400), max_size=10),
    final_newline=st.booleans(),
)
def test_split_lines_matches_plain_split(lines, cuts, final_newline):
    data = "\n".join(lines).encode() + (b"\n" if final_newline else b"")
    bounds = sorted({c for c in cuts if c < len(data)} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    expected = data.split(b"\n")
    if expected and expected[-1] == b"":
        expected.pop()
    assert list(rd.split_lines(chunks)) == expected
    assert [line.decode() for line in rd.split_lines(chunks)] == [s for s in lines][: len(expected)]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    read_size=st.integers(1, 300),
    cut=st.integers(0, 10**6),
)
def test_iter_decompressed_round_trip_and_truncation(sizes, read_size, cut):
    """Multi-frame zstd: any read size gives the bytes back; a cut inside a frame is reported,
    a cut at a frame boundary is a shorter but complete file."""
    frames, n = [], 0
    for size in sizes:
        frames.append(b"".join(b'{"id":"x%d","t":"\xc3\xa9"}\n' % (n + i) for i in range(size)))
        n += size
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=False)
    objs = [cctx.compressobj() for _ in frames]
    blobs = [o.compress(f) + o.flush() for o, f in zip(objs, frames, strict=True)]
    data = b"".join(blobs)
    assert b"".join(rd.iter_decompressed(io.BytesIO(data), "x.zst", read_size)) == b"".join(frames)
    cut %= len(data) + 1
    ends = list(itertools.accumulate(len(b) for b in blobs))
    if cut == 0 or cut in ends:
        got = b"".join(rd.iter_decompressed(io.BytesIO(data[:cut]), "x.zst", read_size))
        assert got == b"".join(frames[: ends.index(cut) + 1] if cut else [])
    else:
        with pytest.raises(rd.StreamTruncated):
            b"".join(rd.iter_decompressed(io.BytesIO(data[:cut]), "x.zst", read_size))


def test_older_pushshift_codecs(tmp_path, no_creds):
    recs = [submission(f"z{i}", created_utc=JAN_2015 + i) for i in range(4)]
    body = b"".join(json.dumps(r).encode() + b"\n" for r in recs)
    (tmp_path / "in").mkdir()
    # Two bz2 streams back to back (as concatenated files are) and an xz file.
    (tmp_path / "in" / "RS_2015-01.bz2").write_bytes(bz2.compress(body[:300]) + bz2.compress(body[300:]))
    (tmp_path / "in" / "RS_v2_2015-01.xz").write_bytes(lzma.compress(body))
    posts, dead, counters = run_reader(ctx_for(tmp_path / "in", tmp_path), tmp_path, read_size=50)
    assert set(posts) == {"z0", "z1", "z2", "z3"} and dead == []
    assert counters["duplicate_posts"] == 4


def test_split_lines_skips_overlong_lines():
    chunks = [b"ok1\n", b"x" * 30, b"x" * 30, b"y\nok2\n"]
    assert list(rd.split_lines(chunks, max_line=40)) == [b"ok1", None, b"ok2"]


def test_truncated_stream_keeps_earlier_lines_and_dead_letters_once(tmp_path, no_creds):
    recs = [submission(f"t{i}", created_utc=JAN_2015 + i) for i in range(30)]
    write_dump(tmp_path / "in" / "RS_2015-01.zst", recs, frames=3, truncate=True)
    posts, dead, counters = run_reader(ctx_for(tmp_path / "in", tmp_path), tmp_path, read_size=64)
    kept = sorted(posts, key=lambda i: int(i[1:]))
    # Everything of the two complete frames, nothing invented: a prefix of the records.
    assert len(kept) >= 20 and kept == [f"t{i}" for i in range(len(kept))] and len(kept) < 30
    assert [(d["kind"], d["reason"], d["source_id"]) for d in dead] == [
        ("line", "truncated_stream", "RS_2015-01.zst")
    ]
    assert f"kept the {len(kept)} lines" in dead[0]["detail"]
    assert counters["line:truncated_stream"] == 1


def test_corrupt_stream_and_not_zstd(tmp_path, no_creds):
    path = write_dump(tmp_path / "in" / "DIY_submissions.zst", [submission(f"k{i}") for i in range(3)])
    (tmp_path / "in" / "RS_2015-02.zst").write_bytes(b"this is not zstd at all\n" * 4)
    posts, dead, _ = run_reader(ctx_for(tmp_path / "in", tmp_path), tmp_path)
    assert set(posts) == {"k0", "k1", "k2"} and path.exists()
    assert [(d["reason"], d["source_id"]) for d in dead] == [("truncated_stream", "RS_2015-02.zst")]


def test_bad_lines_are_dead_letters_and_field_quirks(tmp_path, no_creds):
    recs = [
        submission("q1", created_utc=str(JAN_2015 + 5)),  # created_utc as a string
        submission("q2", created_utc=float(JAN_2015 + 6) + 0.0),
        submission("t3_q3"),  # fullname as id
        {k: v for k, v in submission("q4", ups=77).items() if k not in ("score", "is_self", "domain")},
        {k: v for k, v in submission("q5").items() if k not in ("score", "ups")},
        submission("q6", author="[deleted]"),  # the user left; the post is still up
        submission("q7", url="http://m.imgur.com/gallery/my-garage-shelves-Xy12Z"),
        submission("q8", url=None),  # counted, not a dead letter
        submission("Q_BAD"),  # not a base36 id
    ]
    garbage = [
        b'{"id": "g1", "subreddit": "DIY", "title": "unterminated',
        b'{"id": "g2", "subreddit": "DIY", "title": "\xff\xfe latin-1 \xe9"}',
        b'["DIY", "a list"]',
        b"binary junk without the name \x00\x01",
        # Nested deeper than Python's stack: json.loads raises RecursionError, not ValueError.
        b'{"id": "g3", "subreddit": "DIY", "deep": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    ]
    write_dump(tmp_path / "in" / "DIY_submissions.zst", recs, garbage_lines=garbage)
    posts, dead, counters = run_reader(ctx_for(tmp_path / "in", tmp_path, galleries="true"), tmp_path)
    assert set(posts) == {"q1", "q2", "q3", "q4", "q5", "q6", "q7"}
    assert posts["q1"]["created_utc"] == JAN_2015 + 5 and isinstance(posts["q1"]["created_utc"], int)
    assert posts["q2"]["created_utc"] == JAN_2015 + 6
    assert posts["q4"]["score"] == 77 and posts["q4"]["domain"] == "imgur.com"
    assert posts["q5"]["score"] == 0
    assert posts["q6"]["author"] == "[deleted]"
    assert (posts["q7"]["album_kind"], posts["q7"]["album_id"]) == ("gallery", "Xy12Z")
    reasons = sorted(d["reason"] for d in dead)
    assert reasons == ["malformed_json"] * 3 + ["malformed_submission", "not_utf8"]
    assert counters["line:not_utf8"] == 1 and counters["line:malformed_json"] == 3
    assert any(d["detail"].startswith("RecursionError") for d in dead)
    assert counters["posts_filtered_not_album"] == 1
    # The junk line without the subreddit's name is skipped unparsed, as any other subreddit.
    assert counters["posts_filtered_subreddit"] == 1


# ---------------------------------------------------------------------------------------------
# Filters: hypothesis against a plain-Python statement of the rules


def _month_index(ts: int) -> int:
    d = datetime.fromtimestamp(ts, UTC)
    return d.year * 12 + d.month - 1


def oracle_keeps(
    rec: dict, sub: str, start: tuple[int, int], end: tuple[int, int], galleries: bool = False
) -> bool:
    if str(rec.get("subreddit")).lower() != sub.lower():
        return False
    m = _month_index(int(float(rec["created_utc"])))
    if not start[0] * 12 + start[1] - 1 <= m <= end[0] * 12 + end[1] - 1:
        return False
    is_self = rec.get("is_self")
    if is_self is None:
        is_self = str(rec.get("domain") or "").startswith("self.")
    if is_self in (True, "true", "True"):
        return False
    # The album scraper's rule: imgur.com/.io (www., m., i.), /a/<id> (with galleries also
    # /gallery/<id> and /t/<tag>/<id>), the id being 5 or 7 letters/digits after any slug.
    url = rec.get("url") or ""
    parts = urlsplit(url)
    segs = [s for s in parts.path.split("/") if s]
    hosts = {f"{p}imgur.{t}" for p in ("", "www.", "m.", "i.") for t in ("com", "io")}
    if parts.scheme.lower() not in ("http", "https") or parts.netloc.lower() not in hosts:
        return False
    if len(segs) >= 2 and segs[0].lower() == "a":
        token = segs[1]
    elif galleries and len(segs) >= 2 and segs[0].lower() == "gallery":
        token = segs[1]
    elif galleries and len(segs) >= 3 and segs[0].lower() in ("t", "topic"):
        token = segs[2]
    else:
        return False
    album_id = token.split("-")[-1]
    if not (len(album_id) in (5, 7) and album_id.isascii() and album_id.isalnum()):
        return False
    return not (rec.get("removed_by_category") or rec.get("selftext") == "[removed]")


_URLS = st.sampled_from(
    [
        "https://imgur.com/a/{id}",
        "http://imgur.com/a/{id}",
        "https://www.imgur.com/a/{id}/",
        "http://m.imgur.com/a/{id}?r=1",
        "https://imgur.com/gallery/{id}",
        "https://imgur.com/gallery/{id}#0",
        "https://imgur.com/gallery/my-desk-{id}",
        "https://imgur.com/t/diy/{id}",
        "https://imgur.io/a/{id}",
        "https://imgur.com/a/shelf-{id}/embed",
        "https://IMGUR.com/a/{id}",
        "https://i.imgur.com/{id}.jpg",
        "https://i.imgur.com/a/{id}",
        "https://imgur.com/A/{id}",
        "https://imgur.com/{id}",
        "https://imgur.com/a/",
        "ftp://imgur.com/a/{id}",
        "https://notimgur.com/a/{id}",
        "https://imgur.com.evil.example/a/{id}",
        "https://www.reddit.com/r/DIY/comments/{id}/x/",
        "",
    ]
)


@st.composite
def raw_submissions(draw, edge_months: tuple[int, ...] = ()):
    """A dump record; created next to a month boundary (often one of ``edge_months``, as
    year*12 + month-1), one second either side, where off-by-one errors live."""
    pid = draw(st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=7))
    months = st.integers(2012 * 12 + 5, 2019 * 12 + 5)
    month = draw(st.sampled_from(edge_months) | months if edge_months else months)
    edge = calendar.timegm((month // 12, month % 12 + 1, 1, 0, 0, 0))
    created = edge + draw(st.sampled_from([-1, 0, 1, 86400 * 15, -86400 * 15]))
    rec = submission(
        pid,
        subreddit=draw(st.sampled_from(["DIY", "diy", "Diy", "woodworking", "DIYUK"])),
        created_utc=draw(st.sampled_from([created, float(created), str(created)])),
        url=draw(_URLS).format(id=draw(st.text("aBcDeFgH123", min_size=1, max_size=8))),
        selftext=draw(st.sampled_from(["", "", "[removed]", "[deleted]", "hi"])),
        author=draw(st.sampled_from(["someone", "[deleted]"])),
    )
    self_mode = draw(st.sampled_from(["false", "false", "true", "missing_self", "missing_link"]))
    if self_mode == "true":
        rec["is_self"] = True
    elif self_mode == "false":
        rec["is_self"] = False
    else:
        del rec["is_self"]
        rec["domain"] = "self.DIY" if self_mode == "missing_self" else "imgur.com"
    if draw(st.booleans()):
        rec["removed_by_category"] = draw(st.sampled_from([None, None, "moderator", "deleted"]))
    return rec


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    start=st.tuples(st.integers(2012, 2018), st.integers(1, 12)),
    months=st.integers(0, 30),
    sub=st.sampled_from(["DIY", "diy", "woodworking"]),
    galleries=st.booleans(),
)
def test_filters_match_oracle(data, start, months, sub, galleries):
    start_index = start[0] * 12 + start[1] - 1
    end_index = start_index + months
    end = (end_index // 12, end_index % 12 + 1)
    recs = data.draw(st.lists(raw_submissions((start_index, end_index + 1)), max_size=15))
    ctx = SourceContext(
        "diy",
        "/x",
        {
            "subreddit": sub,
            "start": f"{start[0]}-{start[1]:02d}",
            "end": f"{end[0]}-{end[1]:02d}",
            "galleries": str(galleries).lower(),
        },
        "/s",
        rd.REDDIT_OPTIONS,
    )
    config = rd.reddit_config(ctx)
    for rec in recs:
        post = rd.normalize_submission(rec)
        assert (rd.filter_reason(post, config) is None) == oracle_keeps(rec, sub, start, end, galleries), rec


def test_album_ids_agree_with_the_scraper():
    assert rd.album_of("https://imgur.com/a/AbC12") == ("a", "AbC12")
    assert rd.album_of("http://www.imgur.com/a/AbC12/layout/grid") == ("a", "AbC12")
    # Galleries only when asked for (the paper: '"/a/" in the URL').
    gallery = "https://imgur.com/gallery/kitchen-remodel-before-after-Q9w8E"
    assert rd.album_of(gallery) is None
    assert rd.album_of(gallery, galleries=True) == ("gallery", "Q9w8E")
    assert rd.album_of("https://imgur.com/t/diy/Q9w8E", galleries=True) == ("gallery", "Q9w8E")
    assert rd.album_of("https://i.imgur.com/AbC12.jpg") is None
    assert rd.album_of("https://imgur.com/AbC12") is None
    # Exactly the scraper's parser: an id it cannot fetch is not an album here either, and the
    # hosts it knows are albums here too.
    assert rd.album_of("https://imgur.com/a/AbC123") is None  # 6 characters: not an imgur id
    assert rd.album_of("https://imgur.io/a/AbC12") == ("a", "AbC12")
    assert rd.album_of("https://i.imgur.com/a/AbC12") == ("a", "AbC12")
    for url in [
        "https://imgur.com/a/AbC12",
        "https://imgur.com/a/x_y-z",
        "https://imgur.com/gallery/AbC1234",
    ]:
        assert rd.album_of(url, galleries=True) == parse_album_url(url)


def test_gallery_posts_need_the_option(tmp_path, no_creds):
    recs = [
        submission("ga1", url="https://imgur.com/a/AbC12"),
        submission("ga2", url="https://imgur.com/gallery/my-garage-shelves-Xy12Z"),
        submission("ga3", url="https://imgur.com/a/AbC123"),  # not an id the scraper can fetch
    ]
    write_dump(tmp_path / "in" / "DIY_submissions.zst", recs)
    posts, _, counters = run_reader(ctx_for(tmp_path / "in", tmp_path), tmp_path)
    assert set(posts) == {"ga1"}
    assert counters["posts_filtered_gallery"] == 1 and counters["posts_filtered_not_album"] == 1
    posts, _, _ = run_reader(ctx_for(tmp_path / "in", tmp_path, galleries="true"), tmp_path)
    assert set(posts) == {"ga1", "ga2"} and posts["ga2"]["album_kind"] == "gallery"


def test_options_are_checked(tmp_path, no_creds, new_pipeline):
    for bad, match in [
        ({"start": "2013-13"}, "start"),
        ({"end": "2018/10"}, "end"),
        ({"start": "2018-11", "end": "2018-10"}, "before start"),
        ({"min_score": "lots"}, "integer"),
        ({"refresh_scores": "maybe"}, "refresh_scores"),
        ({"subreddit": "r/DIY"}, "subreddit"),
        ({"reddit_api_base": "oauth.reddit.com"}, "reddit_api_base"),
        ({"galleries": "sometimes"}, "galleries"),
    ]:
        with pytest.raises(MmlinksError, match=match):
            rd.reddit_config(ctx_for(tmp_path, tmp_path, **bad))
    c = rd.reddit_config(ctx_for(tmp_path, tmp_path, start="2013-01", end="2018-12"))
    assert c.start_utc == calendar.timegm((2013, 1, 1, 0, 0, 0))
    assert c.end_utc == calendar.timegm((2019, 1, 1, 0, 0, 0))
    defaults = {o.name: o.default for o in rd.REDDIT_OPTIONS}
    assert defaults == {
        "subreddit": "DIY",
        "start": "2013-01",
        "end": "2018-10",
        "min_score": "25",
        "galleries": "false",
        "refresh_scores": "auto",
        "reddit_api_base": None,
    }
    assert [o.name for o in rd.REDDIT_OPTIONS if not o.defines_data] == ["reddit_api_base"]
    with pytest.raises(MmlinksError, match="no Reddit submission files"):
        rd.ReadCandidatePosts(ctx_for(tmp_path, tmp_path)).expand(new_pipeline() | beam.Impulse())


def test_dedupe_keeps_latest_retrieved_copy(tmp_path, no_creds):
    old = submission("d1", score=30, retrieved_on=JAN_2015 + 100, title="old copy")
    new = submission("t3_d1", score=900, retrieved_on=JAN_2015 + 9_000_000, title="new copy")
    mid = submission("d1", score=400, retrieved_on=JAN_2015 + 5_000, title="mid copy")
    write_dump(tmp_path / "in" / "RS_2015-01.zst", [old, submission("d2")])
    write_dump(tmp_path / "in" / "DIY_submissions.zst", [new])
    write_dump(tmp_path / "in" / "inc" / "DIY_incremental.ndjson.zst", [mid, submission("d2")])
    posts, _, counters = run_reader(ctx_for(tmp_path / "in", tmp_path), tmp_path)
    assert set(posts) == {"d1", "d2"}
    assert posts["d1"]["title"] == "new copy" and posts["d1"]["score"] == 900
    assert counters["duplicate_posts"] == 3
    assert rd.pick_latest("x", [mid, old]) == mid


def test_filters_judge_the_latest_copy(tmp_path, no_creds):
    """Dedupe first, then filter: an early copy taken before the removal must not survive."""
    early, late = JAN_2015 + 100, JAN_2015 + 9_000_000
    dump = [
        submission("rm1", retrieved_on=early),
        submission("rm2", retrieved_on=early, selftext="[removed]"),  # approved again later
        submission("rm3", retrieved_on=early),
        submission("ok1", retrieved_on=early),
    ]
    later = [
        submission("rm1", retrieved_on=late, removed_by_category="moderator"),
        submission("rm2", retrieved_on=late),
        submission("rm3", retrieved_on=late, selftext="[removed]"),
        submission("ok1", retrieved_on=late),
    ]
    write_dump(tmp_path / "in" / "RS_2015-01.zst", dump)
    write_dump(tmp_path / "in" / "DIY_submissions.zst", later)
    posts, dead, counters = run_reader(ctx_for(tmp_path / "in", tmp_path), tmp_path)
    assert set(posts) == {"rm2", "ok1"} and dead == []
    assert posts["rm2"]["retrieved_on"] == late
    # Counted once per post, not per copy.
    assert counters["posts_filtered_removed"] == 2
    assert counters["posts_candidates"] == 2 and counters["duplicate_posts"] == 4


# ---------------------------------------------------------------------------------------------
# Score refresh through praw against the fixture server


def test_score_refresh(tmp_path, creds, caplog):
    caplog.set_level(logging.DEBUG)
    recs = [submission(f"s{i}", score=5, ups=5, created_utc=JAN_2015 + i) for i in range(150)]
    recs[0]["score"] = 100  # dump says 100, the API says 3: dropped
    write_dump(tmp_path / "in" / "DIY_submissions.zst", recs)
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        for i, r in enumerate(recs):
            if i % 10 != 9:  # every tenth post is gone from the API
                srv.posts[r["id"]] = {**r, "score": 3 if i == 0 else 25 + i}
        ctx = ctx_for(
            tmp_path / "in", tmp_path, refresh_scores="auto", min_score="25", reddit_api_base=srv.url
        )
        posts, dead, counters = run_reader(ctx, tmp_path)
        info = [q for m, p, q, _ in srv.requests if p == "/api/info/"]
    assert dead == []
    assert len(info) == 2 and all(len(q["id"].split(",")) <= 100 for q in info)
    assert sorted(len(q["id"].split(",")) for q in info) == [50, 100]
    expected = {f"s{i}": 25 + i for i in range(1, 150) if i % 10 != 9}
    assert {k: v["score"] for k, v in posts.items()} == expected
    assert all(p["score_refreshed"] and p["dump_score"] == 5 for p in posts.values())
    assert counters["scores_refreshed"] == 135 and counters["scores_not_returned"] == 15
    assert counters["posts_filtered_score"] == 16 and counters["posts_out"] == 134
    text = caplog.text
    assert SECRET not in text and SECRET_ID not in text


def test_missing_posts_keep_dump_score(tmp_path, creds):
    write_dump(
        tmp_path / "in" / "DIY_submissions.zst", [submission("gone", score=60), submission("here", score=1)]
    )
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.posts["here"] = submission("here", score=41)
        ctx = ctx_for(
            tmp_path / "in", tmp_path, refresh_scores="true", min_score="25", reddit_api_base=srv.url
        )
        posts, _, _ = run_reader(ctx, tmp_path)
    assert posts["gone"]["score"] == 60 and posts["gone"]["score_refreshed"] is False
    assert posts["here"]["score"] == 41 and posts["here"]["score_refreshed"] is True


def test_api_failures_keep_dump_scores(tmp_path, creds, no_retry_sleep):
    recs = [submission(f"f{i}", score=30 + i) for i in range(5)]
    write_dump(tmp_path / "in" / "DIY_submissions.zst", recs)
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.posts.update({r["id"]: {**r, "score": 1} for r in recs})
        srv.info_failures = -1  # every /api/info answers 500
        ctx = ctx_for(
            tmp_path / "in", tmp_path, refresh_scores="true", min_score="25", reddit_api_base=srv.url
        )
        posts, dead, counters = run_reader(ctx, tmp_path)
        attempts = srv.paths().count("/api/info/")
    assert {k: v["score"] for k, v in posts.items()} == {f"f{i}": 30 + i for i in range(5)}
    assert not any(p["score_refreshed"] for p in posts.values())
    assert counters["score_refresh_failed"] == 5 and dead == []
    assert attempts == 3  # prawcore's own retries (2), then the batch gives up


def test_failed_refresh_dead_letters_posts_below_min_score(tmp_path, creds, no_retry_sleep):
    """A stale dump score below min_score is not a silent score filter when the refresh failed."""
    recs = [submission("lo1", score=3), submission("lo2", score=24), submission("hi1", score=25)]
    write_dump(tmp_path / "in" / "DIY_submissions.zst", recs)
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.posts.update({r["id"]: {**r, "score": 500} for r in recs})
        srv.info_failures = -1
        ctx = ctx_for(
            tmp_path / "in", tmp_path, refresh_scores="true", min_score="25", reddit_api_base=srv.url
        )
        posts, dead, counters = run_reader(ctx, tmp_path)
    assert set(posts) == {"hi1"} and posts["hi1"]["score_refreshed"] is False
    assert sorted((d["kind"], d["reason"], d["source_id"]) for d in dead) == [
        ("post", "score_refresh_failed", "lo1"),
        ("post", "score_refresh_failed", "lo2"),
    ]
    assert "min_score 25" in dead[0]["detail"] and SECRET not in json.dumps(dead)
    assert counters["post:score_refresh_failed"] == 2 and counters["score_refresh_failed"] == 3
    assert "posts_filtered_score" not in counters


def test_transient_failure_is_retried_by_prawcore(tmp_path, creds, no_retry_sleep):
    write_dump(tmp_path / "in" / "DIY_submissions.zst", [submission("r1", score=1)])
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.posts["r1"] = submission("r1", score=99)
        srv.info_failures = 1
        ctx = ctx_for(tmp_path / "in", tmp_path, refresh_scores="true", reddit_api_base=srv.url)
        posts, _, counters = run_reader(ctx, tmp_path)
    assert posts["r1"]["score"] == 99 and "score_refresh_failed" not in counters


def test_refresh_true_without_credentials_is_a_clear_error(tmp_path, monkeypatch, caplog, capsys, no_creds):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("praw_client_id", SECRET_ID)  # the secret is missing
    write_dump(tmp_path / "in" / "DIY_submissions.zst", [submission("e1")])
    with pytest.raises(MmlinksError) as err:
        rd.ReadCandidatePosts(ctx_for(tmp_path / "in", tmp_path, refresh_scores="true"))
    msg = str(err.value)
    assert "praw_client_secret" in msg and "praw_client_id" not in msg.split("set the environment")[1]
    monkeypatch.delenv("praw_client_id")
    with pytest.raises(MmlinksError, match="praw_client_id, praw_client_secret"):
        rd.make_reddit()
    out = capsys.readouterr()
    for text in (msg, caplog.text, out.out, out.err):
        assert SECRET_ID not in text
    # auto without credentials: dump scores, counted; the score filter applies to them.
    _, _, counters = run_reader(ctx_for(tmp_path / "in", tmp_path, refresh_scores="auto"), tmp_path)
    assert counters["scores_not_refreshed"] == 1
    posts, dead, counters = run_reader(
        ctx_for(tmp_path / "in", tmp_path, refresh_scores="auto", min_score="500"), tmp_path
    )
    assert posts == {} and dead == [] and counters["posts_filtered_score"] == 1


# ---------------------------------------------------------------------------------------------
# Incremental crawl


def _crawl_posts(n: int, start: int, prefix: str = "n") -> list[dict]:
    return [submission(f"{prefix}{i}", created_utc=start + 600 * i, score=1) for i in range(n)]


def _ids_in(files) -> list[str]:
    return [r["id"] for f in files for r in read_dump(Path(f))]


def test_crawl_checkpoints_and_never_duplicates(tmp_path, creds, monkeypatch, no_retry_sleep):
    state = CrawlState(str(tmp_path / "state"))
    out = str(tmp_path / "inc")
    # 130 posts spanning Jan/Feb 2015 (two pages of the listing, two monthly files).
    first = _crawl_posts(130, calendar.timegm((2015, 1, 31, 12, 0, 0)))
    first[5]["author"] = "[deleted]"  # praw turns this into None
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.add_new(first)
        reddit = rd.make_reddit(srv.url)
        now = calendar.timegm((2015, 3, 1, 0, 0, 0))
        r1 = rd.crawl_new_posts(state, out, reddit=reddit, now=now)
        assert r1["new_posts"] == 130 and len(r1["files"]) == 2 and not r1["gap_possible"]
        assert [Path(f).parent.name for f in r1["files"]] == ["2015-01", "2015-02"]
        assert Path(r1["files"][0]).name == "DIY_incremental_20150301T000000Z.ndjson.zst"
        assert sorted(_ids_in(r1["files"])) == sorted(r["id"] for r in first)
        rec = read_dump(Path(r1["files"][0]))[5]
        assert rec["author"] == "[deleted]" and rec["retrieved_on"] == now and rec["subreddit"] == "DIY"
        assert set(rd.DUMP_FIELDS) <= set(rec) and isinstance(rec["created_utc"], int)
        assert state.cursor("reddit-new-diy")["newest_id"] == "n129"

        # Three new posts: the second run writes exactly those.
        srv.add_new(_crawl_posts(3, first[-1]["created_utc"] + 60, prefix="b"))
        r2 = rd.crawl_new_posts(state, out, reddit=reddit, now=now + 60)
        assert r2["new_posts"] == 3 and r2["reached_checkpoint"]
        assert sorted(_ids_in(r2["files"])) == ["b0", "b1", "b2"]
        listing_calls = srv.paths().count("/r/DIY/new")

        # Crash after the file is written but before the cursor moves: the rerun writes the
        # same posts again; the reader's dedupe means nothing is duplicated downstream.
        srv.add_new(_crawl_posts(2, first[-1]["created_utc"] + 6000, prefix="c"))

        def boom(*a, **k):
            raise RuntimeError("killed before the cursor was saved")

        with monkeypatch.context() as m, pytest.raises(RuntimeError):
            m.setattr(CrawlState, "set_cursor", boom)
            rd.crawl_new_posts(state, out, reddit=reddit, now=now + 120)
        assert state.cursor("reddit-new-diy")["newest_id"] == "b2"
        r3 = rd.crawl_new_posts(state, out, reddit=reddit, now=now + 180)
        assert sorted(_ids_in(r3["files"])) == ["c0", "c1"]
        # Nothing new: no file, cursor unchanged.
        r4 = rd.crawl_new_posts(state, out, reddit=reddit, now=now + 240)
        assert r4["new_posts"] == 0 and r4["files"] == [] and r4["cursor"]["newest_id"] == "c1"
        # The checkpoint post was deleted from the listing: stop at the first older post.
        srv.new_posts = [p for p in srv.new_posts if p["id"] != "c1"]
        srv.add_new(_crawl_posts(1, first[-1]["created_utc"] + 9000, prefix="d"))
        r5 = rd.crawl_new_posts(state, out, reddit=reddit, now=now + 300)
        assert _ids_in(r5["files"]) == ["d0"] and r5["reached_checkpoint"]
    assert listing_calls >= 3  # 2 pages for the first run, 1 for the second

    files = fileio.list_files(out)
    assert len(files) == 6  # 2 + 1 + 1 (crashed run) + 1 + 1
    assert sorted(_ids_in(files)).count("c0") == 2
    ctx = ctx_for(out, tmp_path, start="2015-01", end="2015-02")
    monkeypatch.delenv("praw_client_id")
    posts, dead, counters = run_reader(ctx, tmp_path)
    assert set(posts) == {r["id"] for r in first} | {"b0", "b1", "b2", "c0", "c1", "d0"}
    assert counters["duplicate_posts"] == 2 and dead == []


def _post_at(post_id: str, t: int) -> dict:
    return submission(post_id, created_utc=JAN_2015 + t, score=1)


def test_crawl_overlap_fetches_posts_approved_late(tmp_path, creds):
    """Run 1 lists p3, p1; p2 (created between them) is approved later and appears in /new
    at its original time: run 2 fetches p4 and p2, nothing twice."""
    state = CrawlState(str(tmp_path / "state"))
    out = str(tmp_path / "inc")
    p1, p2, p3, p4 = (_post_at(f"p{i}", 100 * i) for i in range(1, 5))
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        reddit = rd.make_reddit(srv.url)
        srv.add_new([p3, p1])
        r1 = rd.crawl_new_posts(state, out, reddit=reddit, now=JAN_2015 + 1000)
        assert sorted(_ids_in(r1["files"])) == ["p1", "p3"]
        srv.add_new([p4])
        srv.approve_late([p2])
        assert [p["id"] for p in srv.new_posts] == ["p4", "p3", "p2", "p1"]
        r2 = rd.crawl_new_posts(state, out, reddit=reddit, now=JAN_2015 + 2000)
        assert sorted(_ids_in(r2["files"])) == ["p2", "p4"]
        assert r2["duplicates_skipped"] == 2 and r2["reached_checkpoint"] and not r2["gap_possible"]
        r3 = rd.crawl_new_posts(state, out, reddit=reddit, now=JAN_2015 + 3000)
        assert r3["new_posts"] == 0 and r3["files"] == []
        assert "recent_ids" not in r3["cursor"] and r3["cursor"]["recent_ids_kept"] == 4
    assert sorted(_ids_in(fileio.list_files(out))) == ["p1", "p2", "p3", "p4"]


def test_crawl_overlap_window_bounds_the_listing(tmp_path, creds):
    state = CrawlState(str(tmp_path / "state"))
    out = str(tmp_path / "inc")
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        reddit = rd.make_reddit(srv.url)
        srv.add_new([_post_at("p3", 300), _post_at("p1", 100)])
        rd.crawl_new_posts(state, out, reddit=reddit, now=JAN_2015 + 1000, overlap_s=150)
        srv.add_new([_post_at("p4", 400)])
        srv.approve_late([_post_at("p2", 200)])
        assert [p["id"] for p in srv.new_posts] == ["p4", "p3", "p2", "p1"]
        # Reads down to 300 - 150: p4 (new), p3 (seen), p2 (new, late), stops at p1.
        r = rd.crawl_new_posts(state, out, reddit=reddit, now=JAN_2015 + 2000, overlap_s=150)
        assert sorted(_ids_in(r["files"])) == ["p2", "p4"]
        assert r["duplicates_skipped"] == 1 and r["overlap_complete"] and r["listed"] == 4
        # Only the overlap window's ids stay in the cursor.
        assert sorted(state.cursor("reddit-new-diy")["recent_ids"]) == ["p3", "p4"]
        with pytest.raises(MmlinksError, match="overlap"):
            rd.crawl_new_posts(state, out, reddit=reddit, overlap_s=-1)
        with pytest.raises(MmlinksError, match="limit"):
            rd.crawl_new_posts(state, out, reddit=reddit, limit=0)


def test_crawl_reads_cursors_written_before_the_overlap(tmp_path, creds):
    state = CrawlState(str(tmp_path / "state"))
    state.set_cursor(
        "reddit-new-diy",
        {"newest_created_utc": JAN_2015 + 300, "newest_id": "p3", "recent_ids": ["p3", "p1"]},
    )
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.add_new([_post_at(f"p{i}", 100 * i) for i in range(1, 5)])
        r = rd.crawl_new_posts(state, str(tmp_path / "inc"), reddit=rd.make_reddit(srv.url))
    assert sorted(_ids_in(r["files"])) == ["p2", "p4"] and r["duplicates_skipped"] == 2


def test_crawl_limit_keeps_the_checkpoint_until_the_gap_is_read(tmp_path, creds):
    state = CrawlState(str(tmp_path / "state"))
    out = str(tmp_path / "inc")
    old = _crawl_posts(5, JAN_2015)
    new = _crawl_posts(10, JAN_2015 + 20_000, prefix="g")
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.add_new(old)
        reddit = rd.make_reddit(srv.url)
        rd.crawl_new_posts(state, out, reddit=reddit, now=JAN_2015 + 10_000)
        srv.add_new(new)
        r = rd.crawl_new_posts(state, out, reddit=reddit, limit=4, now=JAN_2015 + 90_000)
        assert r["new_posts"] == 4 and r["gap_possible"] and not r["reached_checkpoint"]
        cursor = state.cursor("reddit-new-diy")
        assert cursor["newest_id"] == "n4" and {"g9", "g8", "g7", "g6"} <= set(cursor["recent_ids"])
        assert r["gap"] == {
            "after_utc": old[-1]["created_utc"],
            "before_utc": new[6]["created_utc"],
            "checkpoint_kept": True,
        }
        # Without the limit: the rest of the gap, and nothing twice.
        r2 = rd.crawl_new_posts(state, out, reddit=reddit, now=JAN_2015 + 91_000)
        assert sorted(_ids_in(r2["files"])) == [f"g{i}" for i in range(6)]
        assert r2["reached_checkpoint"] and not r2["gap_possible"] and r2["gap"] is None
        assert state.cursor("reddit-new-diy")["newest_id"] == "g9"
    ids = _ids_in(fileio.list_files(out))
    assert sorted(ids) == sorted(r["id"] for r in old + new)


def test_crawl_listing_that_ends_before_the_checkpoint(tmp_path, creds):
    """More posts than the listing holds arrived: the gap is reported and kept in the cursor,
    and the checkpoint moves on (the listing can never reach below it again)."""
    state = CrawlState(str(tmp_path / "state"))
    out = str(tmp_path / "inc")
    old = _crawl_posts(5, JAN_2015)
    new = _crawl_posts(10, JAN_2015 + 20_000, prefix="g")
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.add_new(old)
        reddit = rd.make_reddit(srv.url)
        rd.crawl_new_posts(state, out, reddit=reddit, now=JAN_2015 + 10_000)
        srv.add_new(new)
        srv.new_posts = srv.new_posts[:6]  # Reddit's listing cap: g9 .. g4 only
        r = rd.crawl_new_posts(state, out, reddit=reddit, now=JAN_2015 + 90_000)
        assert r["new_posts"] == 6 and r["gap_possible"] and not r["reached_checkpoint"]
        gap = [old[-1]["created_utc"], new[4]["created_utc"]]
        cursor = state.cursor("reddit-new-diy")
        assert cursor["newest_id"] == "g9" and cursor["gaps"] == [gap]
        assert r["gap"] == {"after_utc": gap[0], "before_utc": gap[1], "checkpoint_kept": False}
        srv.add_new([submission("h0", created_utc=JAN_2015 + 50_000, score=1)])
        r2 = rd.crawl_new_posts(state, out, reddit=reddit, now=JAN_2015 + 91_000)
        assert _ids_in(r2["files"]) == ["h0"] and not r2["gap_possible"]


# ---------------------------------------------------------------------------------------------
# The crawl command


def _crawl_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    from cli import main as cli

    monkeypatch.setattr(cli, "quiet_libraries", lambda: None)  # process-wide settings
    rc = cli.main(["data", "crawl", "diy", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_crawl_command_api_errors_are_one_line(tmp_path, creds, monkeypatch, capsys, caplog, no_retry_sleep):
    import socket

    state = ["--out", str(tmp_path / "inc"), "--state", str(tmp_path / "st")]
    # Wrong credentials: the token endpoint answers 401.
    with RedditFixtureServer("another-app", "another-secret") as srv:
        rc, out, err = _crawl_cli(monkeypatch, capsys, *state, "--reddit-api-base", srv.url)
    errors = [line for line in err.splitlines() if line.startswith("mmlinks: error:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err
    assert "401" in errors[0] and "praw_client_secret" in errors[0]
    # Nothing listening: a connection error after prawcore's retries.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rc, out2, err2 = _crawl_cli(monkeypatch, capsys, *state, "--reddit-api-base", f"http://127.0.0.1:{port}")
    errors = [line for line in err2.splitlines() if line.startswith("mmlinks: error:")]
    assert rc == 2 and len(errors) == 1 and "RequestException" in errors[0] and "network" in errors[0]
    assert "Traceback" not in err2
    for text in (out, err, out2, err2, caplog.text):
        assert SECRET not in text and SECRET_ID not in text
    assert CrawlState(str(tmp_path / "st")).cursor("reddit-new-diy") is None


def test_crawl_command_prints_a_possible_gap(tmp_path, creds, monkeypatch, capsys):
    args = ["--out", str(tmp_path / "inc"), "--state", str(tmp_path / "st")]
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.add_new(_crawl_posts(3, JAN_2015))
        rc, out, err = _crawl_cli(monkeypatch, capsys, *args, "--reddit-api-base", srv.url)
        assert rc == 0 and out.startswith("3 new posts") and "gap_possible" not in err
        srv.add_new(_crawl_posts(6, JAN_2015 + 20_000, prefix="g"))
        rc, out, err = _crawl_cli(monkeypatch, capsys, *args, "--reddit-api-base", srv.url, "--limit", "2")
        assert rc == 0 and "warning: gap_possible" in err and "without --limit" in err
        assert "2015-01-01 00:20:00Z" in err  # the last checkpoint: where the gap starts
        # (not --json here: it points this process's fd 1 at stderr for good)
        rc, out, err = _crawl_cli(monkeypatch, capsys, *args, "--reddit-api-base", srv.url)
        assert rc == 0 and out.startswith("4 new posts") and "gap_possible" not in err


def test_default_user_agent_format():
    ua = rd.default_user_agent()
    assert ua.split(":")[1] == "mmlinks" and "(by u/" in ua


def test_an_escaped_lone_surrogate_is_repaired_not_a_crashed_build(tmp_path):
    """``"\\ud83d"`` is valid JSON that no encoder accepts; Beam's coders would fail on it."""
    line = json.dumps(submission("sur1", title="half an emoji \ud83d here")).encode()  # ASCII: escaped
    write_dump(tmp_path / "in" / "RS_2015-01.zst", [line])
    posts, dead, counters = run_reader(ctx_for(tmp_path / "in", tmp_path), tmp_path)
    assert posts["sur1"]["title"] == "half an emoji \ufffd here"
    assert counters["text_repaired"] == 1 and not dead


def test_run_crawl_turns_api_errors_into_one_scrubbed_line(tmp_path, creds, no_retry_sleep):
    """The library entry the CLI and Dagster share: one-line MmlinksError, hint, no credentials."""
    import socket

    with RedditFixtureServer("another-app", "another-secret") as srv:
        with pytest.raises(MmlinksError) as info:
            rd.run_crawl(str(tmp_path / "st"), str(tmp_path / "inc"), api_base=srv.url)
    text = str(info.value)
    assert "\n" not in text and "401" in text and "praw_client_secret" in text
    assert "checkpoint did not move" in text and SECRET not in text and SECRET_ID not in text
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(MmlinksError, match=r"RequestException.*network"):
        rd.run_crawl(str(tmp_path / "st"), str(tmp_path / "inc"), api_base=f"http://127.0.0.1:{port}")
    assert CrawlState(str(tmp_path / "st")).cursor("reddit-new-diy") is None


def test_run_crawl_reports_a_possible_gap(tmp_path, creds):
    st, out = str(tmp_path / "st"), str(tmp_path / "inc")
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.add_new(_crawl_posts(3, JAN_2015))
        first = rd.run_crawl(st, out, api_base=srv.url)
        assert first["new_posts"] == 3 and rd.gap_warning("DIY", first) is None
        srv.add_new(_crawl_posts(6, JAN_2015 + 20_000, prefix="g"))
        second = rd.run_crawl(st, out, api_base=srv.url, limit=2)
        warning = rd.gap_warning("DIY", second)
        assert warning.startswith("gap_possible") and "without --limit" in warning


# ---------------------------------------------------------------------------------------------
# Faults (issue #19): files that are not dumps, decompression bombs, interrupted score refreshes


def _not_reddit_folder(root: Path) -> Path:
    """JSON files that are not Reddit submissions, nested as a careless --input might be."""
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"name": "DIY tools", "version": 2}, indent=2))
    (root / "nested" / "items.jsonl").write_text(
        "".join(
            json.dumps({"sku": i, "title": "a DIY shelf", "subreddit_like": "DIY"}) + "\n" for i in range(20)
        )
    )
    (root / "nested" / "deeper" / "list.json").write_text(json.dumps([{"id": "x", "name": "DIY"}]))
    return root


def test_json_files_that_are_not_submissions_are_named_not_read(tmp_path, no_creds):
    src = _not_reddit_folder(tmp_path / "in")
    write_dump(src / "DIY_submissions.ndjson", [submission("ok1")])  # one real file beside them
    posts, dead, counters = run_reader(ctx_for(src, tmp_path), tmp_path)
    assert set(posts) == {"ok1"}
    assert sorted((d["kind"], d["reason"], d["source_id"]) for d in dead) == [
        ("file", "not_submissions", "config.json"),
        ("file", "not_submissions", "items.jsonl"),
        ("file", "not_submissions", "list.json"),
    ]
    assert all("is a Reddit submission" in d["detail"] for d in dead)
    assert counters["file:not_submissions"] == 3 and counters["reddit_files_read"] == 4
    assert counters["reddit_files_read:json"] == 2 and counters["reddit_files_read:ndjson"] == 1
    # the 20-line file is abandoned after its first lines, not read to the end
    assert counters["reddit_lines_read"] == 1


def _rle_zstd_bomb(total: int, byte: int = ord("x")) -> bytes:
    """A real zstd frame of RLE blocks: 4 bytes per 128 KiB of output (32768-fold)."""
    block = 128 * 1024
    header = b"\x28\xb5\x2f\xfd" + bytes([0x00, 0x38])  # magic; no content size; 128 KiB window
    blocks = total // block
    body = b"".join(
        ((i == blocks - 1) | (1 << 1) | (block << 3)).to_bytes(3, "little") + bytes([byte])
        for i in range(blocks)
    )
    return header + body


def test_zstd_bomb_output_is_bounded_per_call_and_refused(tmp_path, no_creds):
    bomb = _rle_zstd_bomb(1 << 30)  # 32 KiB -> 1 GiB
    assert len(bomb) < 40_000
    assert zstandard.ZstdDecompressor().decompressobj().decompress(bomb[:4096])[:1] == b"x"  # really zstd
    from pipelines.sources.reddit.config import ZSTD_FEED
    from pipelines.sources.reddit.dumps import DecompressionBomb, iter_decompressed

    biggest, total = 0, 0
    with pytest.raises(DecompressionBomb, match="over 1000x"):
        for chunk in iter_decompressed(io.BytesIO(bomb), "RS_2015-01.zst"):
            biggest, total = max(biggest, len(chunk)), total + len(chunk)
    assert biggest <= (ZSTD_FEED // 4 + 1) * 128 * 1024  # never the whole GiB in one call
    assert total <= 64 << 20  # refused soon after the floor, not after 1 GiB
    # Through the reader: the bomb is a dead letter with its reason; the real file beside it is read.
    src = tmp_path / "in"
    write_dump(src / "DIY_submissions.zst", [submission("ok1")])
    good = (src / "DIY_submissions.zst").read_bytes()
    (src / "RS_2015-01.zst").write_bytes(good + bomb)  # a real first frame, then the bomb
    posts, dead, counters = run_reader(ctx_for(src, tmp_path), tmp_path)
    assert set(posts) == {"ok1"}
    assert [(d["reason"], d["source_id"]) for d in dead] == [("decompression_bomb", "RS_2015-01.zst")]
    assert "kept the 1 lines before it" in dead[0]["detail"]
    assert counters["line:decompression_bomb"] == 1


def test_bz2_and_xz_output_is_bounded_per_call():
    from pipelines.sources.reddit.config import OUT_CHUNK
    from pipelines.sources.reddit.dumps import Bounds, iter_decompressed

    body = b"\n" * (10 << 20)
    for name, data in (("RS_2015-01.bz2", bz2.compress(body)), ("RS_2015-01.xz", lzma.compress(body))):
        sizes = [len(c) for c in iter_decompressed(io.BytesIO(data), name, bounds=Bounds(floor=1 << 40))]
        assert sum(sizes) == len(body) and max(sizes) <= OUT_CHUNK, name


def test_score_refresh_is_checkpointed_so_a_rerun_asks_only_for_the_rest(tmp_path, creds, no_retry_sleep):
    recs = [submission(f"c{i}", score=5, ups=5, created_utc=JAN_2015 + i) for i in range(150)]
    write_dump(tmp_path / "in" / "DIY_submissions.zst", recs)
    with RedditFixtureServer(SECRET_ID, SECRET) as srv:
        srv.posts.update({r["id"]: {**r, "score": 30 + i} for i, r in enumerate(recs)})
        ctx = ctx_for(
            tmp_path / "in", tmp_path, refresh_scores="true", min_score="25", reddit_api_base=srv.url
        )
        # The first build is cut short: the first batch's call fails (with prawcore's retries).
        srv.info_failures = 3
        _, _, first = run_reader(ctx, tmp_path)
        asked_first = [q["id"].split(",") for _, p, q, _ in srv.requests if p == "/api/info/"]
        n_first = len(srv.requests)
        posts, dead, second = run_reader(ctx, tmp_path)
        asked_second = [q["id"].split(",") for _, p, q, _ in srv.requests[n_first:] if p == "/api/info/"]
        # Scores taken an hour after posting (long ago) had not settled: a later build asks again.
        for f in (tmp_path / "state").rglob("*.json"):
            rec = json.loads(f.read_text())
            f.write_text(json.dumps({**rec, "at": JAN_2015 + int(rec["_key"][1:]) + 3600}))
        n_second = len(srv.requests)
        _, _, third = run_reader(ctx, tmp_path)
        asked_third = [
            i for _, p, q, _ in srv.requests[n_second:] if p == "/api/info/" for i in q["id"].split(",")
        ]
    assert first["score_refresh_failed"] in (50, 100)
    refreshed_first = {i for ids in asked_first[3:] for i in ids}  # the batch that answered
    assert len(refreshed_first) == 150 - first["score_refresh_failed"]
    # the rerun asks once, only for the posts the first run could not refresh
    assert len(asked_second) == 1
    assert set(asked_second[0]) == {f"t3_{r['id']}" for r in recs} - refreshed_first
    assert second["scores_from_checkpoint"] == len(refreshed_first)
    assert dead == [] and {k: v["score"] for k, v in posts.items()} == {f"c{i}": 30 + i for i in range(150)}
    assert all(p["score_refreshed"] for p in posts.values())
    assert len(asked_third) == 150 and "scores_from_checkpoint" not in third
    records = [f.read_text() for f in (tmp_path / "state").rglob("*.json")]
    assert len(records) == 150 and not any(SECRET in r or SECRET_ID in r for r in records)
