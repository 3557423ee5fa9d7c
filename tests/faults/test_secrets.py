"""Credentials in the environment never reach what mmlinks writes or prints (issue #19).

Every credential the code reads (Reddit's praw app, imgur's client id, an MLflow server's token
and password, a Ray cluster's token) is set to a distinctive value; a real diy build (CLI, Beam,
praw against a loopback Reddit, imgur's API v3 with the client id), a failing build (Reddit
refuses the secret), a model registration into a SQLite MLflow store, and commands failing
against servers that echo the request headers into their error bodies then run. Everything they
wrote (shards, manifest, build.log, dead letters, crawl state, mlflow.db, artifacts) and printed
(stdout, stderr, error messages) is scanned for each value and for the base64 form basic auth
sends: zero occurrences.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli.test_cli import MMLINKS
from tests.fixtures.imgur import ImgurFixtureServer, diy_albums
from tests.fixtures.reddit import RedditFixtureServer, submission, write_dump

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SECRETS = {
    "praw_client_id": "f19-reddit-ID-9c1e5a",
    "praw_client_secret": "f19-reddit-SECRET-41ab7d",
    "IMGUR_CLIENT_ID": "f19-imgur-CLIENT-77d03e",
    "MLFLOW_TRACKING_TOKEN": "f19-mlflow-TOKEN-3f5e21",
    "MLFLOW_TRACKING_USERNAME": "f19user",
    "MLFLOW_TRACKING_PASSWORD": "f19-mlflow-PASSWORD-a2c4",
    "RAY_AUTH_TOKEN": "f19-ray-TOKEN-0b8d66",
}
URI_PASSWORD = "f19-uri-PASSWORD-5e6f"
FORBIDDEN = [v for k, v in SECRETS.items() if k != "MLFLOW_TRACKING_USERNAME"] + [
    URI_PASSWORD,
    base64.b64encode(f"f19user:{SECRETS['MLFLOW_TRACKING_PASSWORD']}".encode()).decode(),
    base64.b64encode(f"f19user:{URI_PASSWORD}".encode()).decode(),
]


def _leaks(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [s for s in FORBIDDEN if s.encode() in data]


def _scan_tree(root: Path, stats) -> int:
    """Scan every file under ``root``; returns how many were read."""
    n = 0
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert _leaks(path.read_bytes()) == [], path
            n += 1
    stats.add(invariant_checks=n)
    return n


def _secret_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_ADDRESS"))}
    return {**env, **SECRETS, "praw_user_agent": "linux:mmlinks-faults:0.1 (by u/nobody)", **extra}


def _cli(args: list[str], env: dict, stats) -> subprocess.CompletedProcess:
    proc = subprocess.run([MMLINKS, *args], capture_output=True, text=True, timeout=600, env=env)
    assert _leaks(proc.stdout) == [] and _leaks(proc.stderr) == [], (proc.stdout + proc.stderr)[-3000:]
    stats.add(invariant_checks=1)
    return proc


def test_diy_builds_with_credentials_write_and_print_none_of_them(tmp_path, fault_stats):
    dumps = tmp_path / "dumps"
    records = [
        submission("sec1", url="https://imgur.com/a/Good201"),
        submission("sec2", url="https://imgur.com/a/GoodJsn"),
        submission("sec3", url="https://imgur.com/a/Gone404"),  # a dead letter
    ]
    write_dump(dumps / "RS_2015-01.zst", records)
    env = _secret_env()
    with (
        RedditFixtureServer(SECRETS["praw_client_id"], SECRETS["praw_client_secret"]) as reddit,
        ImgurFixtureServer(diy_albums(), client_id=SECRETS["IMGUR_CLIENT_ID"]) as imgur,
    ):
        reddit.posts.update({r["id"]: dict(r) for r in records})
        reddit_url = reddit.url
        options = [
            f"reddit_api_base={reddit.url}",
            f"imgur_api_base={imgur.base}",
            f"imgur_page_base={imgur.base}",
            f"imgur_image_base={imgur.base}",
            "allow_private=true",
            "polite=false",
        ]
        build = ["data", "build", "--source", "diy", "--input", str(dumps), "--direct-workers", "1"]
        build += [a for o in options for a in ("--source-option", o)]
        proc = _cli([*build, "--out", str(tmp_path / "ds"), "--json"], env, fault_stats)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout)
        assert sum(result["splits"].values()) == 2 and result["dropped"]["document:album_not_found"] == 1
        # the credentials were really used: praw's token endpoint and imgur's API v3 were asked
        assert reddit.paths("POST") and any(p.startswith("/3/album/") for p in imgur.counts)
    # A build whose credentials Reddit refuses fails: its message names the variables, not values.
    with RedditFixtureServer(SECRETS["praw_client_id"], "another-secret") as refusing:
        bad = [o.replace(reddit_url, refusing.url) for o in build]
        proc = _cli([*bad, "--out", str(tmp_path / "ds-refused")], env, fault_stats)
    fault_stats.add(faults_injected=1)
    assert proc.returncode != 0 or "401" in proc.stderr, proc.stderr[-3000:]
    assert _scan_tree(tmp_path, fault_stats) > 10


class _EchoServer:
    """Answers every request with ``status`` and a JSON error body that echoes the request's
    headers (``Authorization`` included), as a careless auth proxy may."""

    def __init__(self, status: int):
        status_code = status

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                body = json.dumps(
                    {"error_code": "UNAUTHENTICATED", "message": f"denied {dict(self.headers)}"}
                ).encode()
                self.send_response(status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_registration_and_failing_servers_keep_credentials_out(
    dataset, tmp_path, monkeypatch, capsys, fault_stats
):
    from cli.main import main
    from orchestration.ray_jobs import RayJobError, connect
    from tests.linking.conftest import register_model

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    register_model(tmp_path / "mlflow", dataset, seed=0, name="secret-scan")  # a SQLite store
    assert (tmp_path / "mlflow" / "mlflow.db").exists()

    echo = _EchoServer(401)
    try:
        # MLflow sends the URI's user info as basic auth; the server echoes it back in its error
        host = echo.url.removeprefix("http://")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://f19user:{URI_PASSWORD}@{host}")
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        code = main(["promote", "--rollback", "--model-name", "secret-scan", "--workdir", str(tmp_path)])
        out = capsys.readouterr()
        assert code == 2 and "mmlinks: error:" in out.err, out.err
        assert "***" in out.err  # the echoed credential was there, and was scrubbed
        assert _leaks(out.out + out.err) == [], out.err
        # the Ray job client with a cluster token, against the same echoing server
        with pytest.raises(RayJobError) as err:
            connect(echo.url)
        assert _leaks(str(err.value)) == [], str(err.value)
    finally:
        echo.close()
    fault_stats.add(faults_injected=2, invariant_checks=2)
    assert _scan_tree(tmp_path, fault_stats) > 3


def test_build_log_is_scrubbed_of_credentials_libraries_print(tmp_path, monkeypatch, fault_stats):
    """What a library or a worker process prints during a build (fd 2: a C library, a child
    process, Python logging) reaches ``build.log`` with every credential replaced by ``***``,
    including a secret split over writes and one inside a 100 KiB line without a newline."""
    import logging
    import sys

    from schemas.library_output import library_output_to

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://f19user:{URI_PASSWORD}@127.0.0.1:1")
    secret = SECRETS["praw_client_secret"]
    log_path = tmp_path / "build.log"
    with library_output_to(log_path):
        os.write(2, f"raw fd write: url=http://f19user:{URI_PASSWORD}@host\n".encode())
        os.write(2, f"split write: {secret[:7]}".encode())
        os.write(2, f"{secret[7:]} ends here\n".encode())
        subprocess.run(["sh", "-c", 'echo "child process: $RAY_AUTH_TOKEN" >&2'], check=True)
        handler = logging.StreamHandler(open(os.dup(2), "w"))  # as a library's handler on fd 2
        logging.getLogger("f19").addHandler(handler)
        logging.getLogger("f19").setLevel(logging.WARNING)  # an earlier in-process CLI call quiets root
        logging.getLogger("f19").warning("logging: token %s", SECRETS["MLFLOW_TRACKING_TOKEN"])
        handler.stream.close()
        logging.getLogger("f19").removeHandler(handler)
        os.write(2, ("x" * 65530 + FORBIDDEN[-2] + "y" * 40000).encode())
        print("to the terminal", file=sys.stderr)
    text = log_path.read_text()
    for line in ("raw fd write: url=http://f19user:***@host", "split write: *** ends here"):
        assert line in text
    assert "child process: ***" in text and "logging: token ***" in text
    assert "x" * 65530 + "***" + "y" * 40000 in text
    assert not _leaks(text), _leaks(text)
    fault_stats.add(faults_injected=6, invariant_checks=len(FORBIDDEN))


def test_a_full_disk_under_the_build_log_stops_the_log_without_a_thread_traceback(monkeypatch):
    """``/dev/full`` answers every write with ENOSPC: the copier stops writing, keeps draining the
    pipe (a writer never blocks) and raises nothing (issue #62: it printed a 17-line thread
    traceback before the build's own one-line error)."""
    import os
    import threading
    from pathlib import Path

    from schemas.library_output import library_output_to

    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    with library_output_to(Path("/dev/full")):
        for _ in range(64):  # 4 MiB: far past the pipe's buffer, so a stalled copier would block
            os.write(2, b"x" * 65535 + b"\n")
    assert raised == []
