"""The diy source as a user runs it: dump files -> score refresh -> album scraping -> shards.

Three loopback servers speak the real protocols: Reddit's OAuth API (praw's real code path),
imgur album pages, and image downloads. The CLI runs as a subprocess with credentials in its
environment; afterwards no file it wrote and nothing it printed contains them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.manifest import Manifest
from schemas.shards import read_documents
from tests.fixtures.imgur import ImgurFixtureServer, diy_albums
from tests.fixtures.reddit import BASE_UTC, RedditFixtureServer, submission, write_dump

MMLINKS = str(Path(sys.executable).parent / "mmlinks")
CLIENT_ID = "diy-e2e-ID-must-not-leak"
SECRET = "diy-e2e-SECRET-must-not-leak"


def mmlinks(*args: str) -> dict:
    env = {
        **os.environ,
        "praw_client_id": CLIENT_ID,
        "praw_client_secret": SECRET,
        "praw_user_agent": "linux:mmlinks-tests:0.1 (by u/nobody)",
    }
    env.pop("IMGUR_CLIENT_ID", None)
    proc = subprocess.run([MMLINKS, *args, "--json"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for secret in (CLIENT_ID, SECRET):
        assert secret not in proc.stdout and secret not in proc.stderr
    return json.loads(proc.stdout)


def _no_secret_in_files(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert CLIENT_ID.encode() not in data and SECRET.encode() not in data, path


@pytest.mark.slow
def test_diy_build_then_incremental_crawl_and_rebuild(tmp_path):
    dumps = tmp_path / "dumps"
    records = [
        submission("aaa1", url="https://imgur.com/a/Good201"),
        submission("aaa2", url="http://m.imgur.com/a/GoodJsn#0", score=3),  # refreshed to 200
        submission("aaa3", url="https://imgur.com/a/Gone404"),
        submission("aaa4", url="https://imgur.com/a/OnlyGif", score=2),  # refreshed to 4: dropped
        submission("aaa5", url="https://imgur.com/a/NoMarkp", subreddit="woodworking"),
    ]
    write_dump(dumps / "RS_2015-01.zst", records)
    with RedditFixtureServer(CLIENT_ID, SECRET) as reddit, ImgurFixtureServer(diy_albums()) as imgur:
        reddit.posts.update({r["id"]: dict(r) for r in records})
        reddit.posts["aaa2"]["score"] = 200
        reddit.posts["aaa4"]["score"] = 4
        options = [
            f"reddit_api_base={reddit.url}",
            f"imgur_page_base={imgur.base}",
            f"imgur_image_base={imgur.base}",
            "allow_private=true",
            "polite=false",
        ]
        build_args = [
            "data", "build", "--source", "diy", "--input", str(dumps), "--out", str(tmp_path / "ds"),
            "--direct-workers", "1",
            *[a for o in options for a in ("--source-option", o)],
        ]  # fmt: skip
        first = mmlinks(*build_args)
        shards = Manifest.read(str(tmp_path / "ds")).shard_paths(tmp_path / "ds")
        docs = {d.doc_id: d for d in read_documents(shards)}
        assert sorted(docs) == ["diy-aaa1", "diy-aaa2"]
        good = docs["diy-aaa1"]
        assert good.metadata["score"] == "120" and docs["diy-aaa2"].metadata["score"] == "200"
        # Good201: 5 images, 4 captions; each caption is linked to the image it was written beside.
        assert len(good.images) == 5 and len(good.sentences) == 4
        assert sorted(good.links) == [(0, 0), (1, 1), (2, 3), (3, 4)]
        assert first["dropped"]["document:album_not_found"] == 1
        assert sum(first["splits"].values()) == 2

        # A week later: two new posts; the incremental crawl fetches only those.
        new = [
            submission("bbb1", url="https://imgur.com/a/BigAlbm", created_utc=BASE_UTC + 86400 * 40),
            submission("bbb2", url="https://imgur.com/a/Deleted", created_utc=BASE_UTC + 86400 * 41),
        ]
        reddit.add_new(new)
        crawl_args = [
            "data", "crawl", "diy", "--out", str(dumps / "incremental"), "--state", str(tmp_path / "st"),
            "--reddit-api-base", reddit.url,
        ]  # fmt: skip
        crawled = mmlinks(*crawl_args)
        assert crawled["new_posts"] == 2 and crawled["files"]
        assert mmlinks(*crawl_args)["new_posts"] == 0  # the checkpoint holds
        assert imgur.counts["/a/Good201"] == 1
        second = mmlinks(*build_args)
        assert sum(second["splits"].values()) == 4
        assert second["dataset_version"] != first["dataset_version"]
        assert imgur.counts["/a/Good201"] == 1  # finished albums are never fetched again
        assert imgur.counts["/a/BigAlbm"] == 1
    _no_secret_in_files(tmp_path)
