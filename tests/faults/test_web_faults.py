"""The polite client against servers that misbehave on purpose (issue #19): connections reset
mid-body, bodies shorter than their Content-Length, redirects to private addresses, gzip bombs,
a body dripped one byte at a time (slowloris).
Invariant for each: a damaged or refused response is never returned as a good one, and the
failure has a dead-letter reason (``HttpError.reason``), transient when a rerun may succeed."""

from __future__ import annotations

import socket
import threading
import time
import zlib

import pytest

from pipelines.web import HttpError
from tests.pipelines.test_http_client import FakeTime, fresh_gates, make_client, send, serve  # noqa: F401

pytestmark = [pytest.mark.faults, pytest.mark.slow]
BODY = b"x" * 200_000


def _reset_mid_body(h):
    h.send_response(200)
    h.send_header("Content-Length", str(len(BODY)))
    h.end_headers()
    h.wfile.write(BODY[:50_000])
    h.wfile.flush()
    h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    h.connection.close()  # SO_LINGER 0: an RST, not a FIN


def _short_body(h):
    h.send_response(200)
    h.send_header("Content-Length", str(len(BODY)))
    h.end_headers()
    h.wfile.write(BODY[: len(BODY) // 2])  # then the handler returns: the server closes (HTTP/1.0)


@pytest.mark.parametrize("app", [_reset_mid_body, _short_body], ids=["reset", "truncated"])
def test_damaged_bodies_are_retried_then_a_transient_failure_never_a_response(serve, app, fault_stats):  # noqa: F811
    server = serve(app)
    client = make_client(server, max_retries=2)
    with pytest.raises(HttpError) as err:
        client.get(server.url("/a.jpg"))
    assert err.value.transient and err.value.reason == "retries_exhausted", err.value
    assert len(server.hits) == 3  # 1 + max_retries, each a fault
    fault_stats.add(faults_injected=len(server.hits), invariant_checks=1)


def test_a_damaged_body_then_a_whole_one_returns_the_whole_one(serve, fault_stats):  # noqa: F811
    from tests.pipelines.test_http_client import sequence

    server = serve(sequence(_short_body, lambda h: send(h, 200, BODY)))
    resp = make_client(server, max_retries=2).get(server.url("/a.jpg"))
    assert resp.status == 200 and resp.body == BODY
    fault_stats.add(faults_injected=1, invariant_checks=1)


@pytest.mark.parametrize(
    "target", ["http://10.0.0.7/x", "http://169.254.169.254/latest/meta-data/", "http://[::1]:1/"]
)
def test_redirect_to_a_private_address_is_refused(serve, target, fault_stats):  # noqa: F811
    """The allowlist names the public host; its redirect to a private address must not be followed
    even when that address is allowlisted by name (the SSRF guard checks every hop's address)."""
    server = serve(lambda h: send(h, 302, b"", {"Location": target}))
    host = target.split("/")[2]
    client = make_client(server, allowed_hosts=frozenset({server.host, host}), allow_private=False)
    with pytest.raises(HttpError) as err:
        client.get(server.url("/a.jpg"))
    assert err.value.reason in ("not_allowed", "private_address", "retries_exhausted", "blocked_address"), (
        err.value
    )
    fault_stats.add(faults_injected=1, invariant_checks=1)


def _gzip_bomb(decoded: int) -> bytes:
    """Concatenated gzip members of 1 MiB of zeros each: ~1 KiB per MiB decoded."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = z.compress(b"\0" * (1 << 20)) + z.flush()
    return member * (decoded >> 20)


def test_gzip_bomb_is_refused_at_the_byte_limit(serve, fault_stats):  # noqa: F811
    bomb = _gzip_bomb(4 << 30)  # 4 GiB decoded
    assert len(bomb) < 8 << 20
    server = serve(lambda h: send(h, 200, bomb, {"Content-Encoding": "gzip", "Content-Type": "image/jpeg"}))
    client = make_client(server, max_bytes=1 << 20)
    with pytest.raises(HttpError) as err:
        client.get(server.url("/bomb.jpg"))
    assert err.value.reason == "too_large" and not err.value.transient, err.value
    assert len(server.hits) == 1  # refused for good, not retried
    fault_stats.add(faults_injected=1, invariant_checks=1)


DRIP_EVERY_S = 0.2
DRIP_BYTES = 150  # 30 s of dripping: far past any deadline the test sets, and a bound if none fires


def _slowloris(stop: threading.Event, dripped: list[int]):
    """Headers at once (a Content-Length the drip never reaches), then one byte every 0.2 s:
    every socket read returns within any read timeout, so only a whole-download deadline ends
    it. ``dripped`` gets how many bytes were sent when the client hung up or the drip ended."""

    def app(h):
        h.send_response(200)
        h.send_header("Content-Type", "image/jpeg")
        h.send_header("Content-Length", str(1 << 20))
        h.end_headers()
        h.wfile.flush()
        n = 0
        try:
            while n < DRIP_BYTES and not stop.wait(DRIP_EVERY_S):
                h.wfile.write(b"x")
                h.wfile.flush()
                n += 1
        finally:
            dripped.append(n)

    return app


@pytest.mark.parametrize("path", ["client", "image_fetch"])
def test_a_dripping_body_fails_at_the_download_deadline(serve, path, fault_stats):  # noqa: F811
    """A server that sends its headers, then one byte every 0.2 s, must not hold a worker
    longer than ``max_seconds``: the fetch fails with the deadline's reason, and the server
    sees the client hang up long before its drip ends. Found by this test: the body was read
    with ``iter_content(64 KiB)``, which waits for a whole 64 KiB chunk (3.6 hours at this
    rate) before the deadline is checked; the server's drip then ended the read instead."""
    from pipelines.image_fetch import FETCH_FAILED, FetchFailed, HttpFetcher

    stop, dripped = threading.Event(), []
    server = serve(_slowloris(stop, dripped))
    max_seconds = 1.0
    try:
        if path == "client":
            client = make_client(server, max_retries=0, max_seconds=max_seconds, timeout=5.0)
            with pytest.raises(HttpError) as err:
                client.get(server.url("/slow.jpg"), use_cache=False)
            assert err.value.reason == "retries_exhausted" and err.value.transient, err.value
            assert "download took over 1 s" in err.value.detail, err.value
        else:
            fetcher = HttpFetcher(timeout=(5.0, 5.0), max_seconds=max_seconds)
            with pytest.raises(FetchFailed) as err:
                fetcher.fetch(server.url("/slow.jpg"), 10_000_000)
            assert err.value.reason == FETCH_FAILED and err.value.transient, err.value
            assert "download took over 1 s" in err.value.detail, err.value
        # The server's side: it noticed the hang-up (a write to a closed socket) before its
        # drip ended. Not a timing assertion: with no deadline the drip runs to its end.
        deadline = time.monotonic() + 10
        while not dripped and time.monotonic() < deadline:
            time.sleep(DRIP_EVERY_S)
        assert dripped and dripped[0] < DRIP_BYTES, dripped
    finally:
        stop.set()
    assert len(server.hits) == 1
    fault_stats.add(faults_injected=1, invariant_checks=1)
