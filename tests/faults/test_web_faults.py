"""The polite client against servers that misbehave on purpose (issue #19): connections reset
mid-body, bodies shorter than their Content-Length, redirects to private addresses, gzip bombs,
a body dripped one byte at a time (slowloris).
Invariant for each: a damaged or refused response is never returned as a good one, and the
failure has a dead-letter reason (``HttpError.reason``), transient when a rerun may succeed."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
import zlib
from urllib.parse import urlsplit

import pytest

from pipelines.web import HttpError
from tests.conftest import missing_tool
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


PUBLIC_NAME, INTERNAL_NAME = "public.test", "internal.test"


@pytest.fixture
def routed_to_loopback(monkeypatch) -> list[tuple[str, int]]:
    """The network at the socket layer: ``PUBLIC_NAME`` resolves to ``PUBLIC_IP`` (an address
    the guard accepts) and a connection to ``PUBLIC_IP`` lands on 127.0.0.1, the same port (so
    a loopback server plays a public host); ``INTERNAL_NAME`` resolves to 127.0.0.1. Returns
    every address a socket connected to or tried, before any rerouting."""
    real_lookup, real_connect = socket.getaddrinfo, socket.socket.connect
    connects: list[tuple[str, int]] = []

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        name = host.decode() if isinstance(host, bytes) else str(host)
        answer = {PUBLIC_NAME: PUBLIC_IP, INTERNAL_NAME: "127.0.0.1"}.get(name.rstrip(".").lower())
        if answer is None:
            return real_lookup(host, port, family, type, proto, flags)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answer, int(port)))]

    def connect(sock, address):
        connects.append((str(address[0]), int(address[1])))
        if address[0] == PUBLIC_IP:
            address = ("127.0.0.1", address[1])
        return real_connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    return connects


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/latest/meta-data/",
        f"http://{INTERNAL_NAME}:{{port}}/latest/meta-data/",  # a name that resolves to loopback
        "http://[::ffff:127.0.0.1]:{port}/x",  # IPv4-mapped loopback
        "http://[2002:7f00:1::1]:{port}/x",  # 6to4 of 127.0.0.1
        "http://10.0.0.7/x",
        "http://169.254.169.254/latest/meta-data/",
    ],
)
def test_redirect_to_a_private_address_is_refused(serve, target, routed_to_loopback, fault_stats):  # noqa: F811
    """An allowed public host (``PUBLIC_NAME``, reaching a loopback server through the patched
    network) answers with a redirect to a private address whose host is allowlisted by name too:
    the first hop is served (the redirect is really sent), the second is refused with
    ``private_address`` on its address, and no socket ever connects to it: the internal server
    on the target's port sees nothing. Before issue #46 the fixture server was on 127.0.0.1
    itself, so the first hop was refused and no redirect was ever sent."""
    internal = serve(lambda h: send(h, 200, b"internal secret"))
    target = target.format(port=internal.port)
    public = serve(lambda h: send(h, 302, b"", {"Location": target}))
    name = urlsplit(target).hostname or ""
    allowed = frozenset({PUBLIC_NAME, f"[{name}]" if ":" in name else name})  # any port
    client = make_client(allowed_hosts=allowed, allow_private=False, max_retries=2)
    with pytest.raises(HttpError) as err:
        client.get(f"http://{PUBLIC_NAME}:{public.port}/a.jpg", use_cache=False)
    assert err.value.reason == "private_address" and not err.value.transient, err.value
    assert public.paths() == ["/a.jpg"]  # the first hop was served: the redirect was sent
    assert internal.hits == []  # the second hop never reached its server
    assert routed_to_loopback == [(PUBLIC_IP, public.port)], routed_to_loopback  # nor any socket
    fault_stats.add(faults_injected=1, invariant_checks=3)


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
            fetcher = HttpFetcher(timeout=(5.0, 5.0), max_seconds=max_seconds, allow_private=True)
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


def _header_drip(stop: threading.Event, dripped: list[int]):
    """A status line and header lines one byte every 0.2 s, never reaching the blank line that
    ends them: every socket read returns within the read timeout, and ``Session.get`` is still
    parsing headers when the drip ends. ``dripped`` as in ``_slowloris``."""
    head = b"HTTP/1.0 200 OK\r\nContent-Type: image/jpeg\r\nX-Padding: " + b"p" * DRIP_BYTES

    def app(h):
        h.close_connection = True
        n = 0
        try:
            while n < DRIP_BYTES and not stop.wait(DRIP_EVERY_S):
                h.wfile.write(head[n : n + 1])
                h.wfile.flush()
                n += 1
        finally:
            dripped.append(n)

    return app


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("path", ["client", "image_fetch"])
def test_dripping_headers_fail_at_the_download_deadline(serve, path, fault_stats):  # noqa: F811
    """The deadline bounds the whole request, not only its body: a server dripping its status
    line and headers, each byte inside the read timeout, is cut off at ``max_seconds`` with the
    body deadline's failure, through the polite client and the image store's plain fetcher.
    Found by this test: the deadline was checked between body reads only, and ``Session.get``
    waited for the headers until the drip ended (then returned the headers cut short as a 200
    with an empty body)."""
    from pipelines.image_fetch import FETCH_FAILED, FetchFailed, HttpFetcher

    stop, dripped = threading.Event(), []
    server = serve(_header_drip(stop, dripped))
    try:
        if path == "client":
            client = make_client(server, max_retries=0, max_seconds=1.5, timeout=0.5)
            with pytest.raises(HttpError) as err:
                client.get(server.url("/slow.jpg"), use_cache=False)
            assert err.value.reason == "retries_exhausted" and err.value.transient, err.value
        else:
            fetcher = HttpFetcher(timeout=(0.5, 0.5), max_seconds=1.5, allow_private=True)
            with pytest.raises(FetchFailed) as err:
                fetcher.fetch(server.url("/slow.jpg"), 10_000_000)
            assert err.value.reason == FETCH_FAILED and err.value.transient, err.value
        assert "download took over 1.5 s" in err.value.detail, err.value
        # The server saw the client hang up before its drip ended (not a timing assertion:
        # with no deadline the drip runs to its end).
        _wait_for(lambda: dripped)
        assert dripped and dripped[0] < DRIP_BYTES, dripped
    finally:
        stop.set()
    assert len(server.hits) == 1
    fault_stats.add(faults_injected=1, invariant_checks=1)


def test_one_deadline_bounds_the_whole_get_redirects_and_retries_included(serve, fault_stats):  # noqa: F811
    """Issue #46: ``max_seconds`` bounded one attempt of one hop, so a server that redirects and
    then drips its headers on every attempt held one ``get`` for (1 + max_retries) deadlines
    (with the defaults, (5+1) x (5+1) x 300 s). Now the redirect, the dripped hop and any
    retry share one deadline: once it has cut the dripping hop, nothing is retried. Counted in
    requests, not seconds: before the fix the server saw the dripped path 1 + 3 times."""
    from tests.pipelines.test_http_client import sequence

    stop, dripped = threading.Event(), []
    redirect = lambda h: send(h, 302, b"", {"Location": "/next.jpg"})
    server = serve(sequence(redirect, _header_drip(stop, dripped)))
    client = make_client(server, max_retries=3, max_seconds=1.5, timeout=0.5)
    try:
        with pytest.raises(HttpError) as err:
            client.get(server.url("/first.jpg"), use_cache=False)
        assert err.value.reason == "retries_exhausted" and err.value.transient, err.value
        assert "download took over 1.5 s" in err.value.detail, err.value
        assert "no time left for a retry" in err.value.detail, err.value
    finally:
        stop.set()
    assert server.paths() == ["/first.jpg", "/next.jpg"]
    fault_stats.add(faults_injected=1, invariant_checks=2)


def test_a_backoff_wait_past_the_deadline_is_not_waited(serve, fault_stats):  # noqa: F811
    """A server answering 503 with ``Retry-After: 1`` to every request, ``max_seconds`` 2.5,
    5 retries, real sleeps: the client stops when the next wait would cross the deadline
    instead of spending six attempts and five seconds (a bound on the count, not a timing)."""
    from pipelines.web import HttpPolicy, PoliteClient

    server = serve(lambda h: send(h, 503, b"busy", {"Retry-After": "1"}))
    policy = HttpPolicy(
        allowed_hosts=frozenset({server.host}),
        allow_private=True,
        rate_per_host=None,
        max_retries=5,
        backoff_max=10.0,
        timeout=5.0,
        max_seconds=2.5,
    )
    with pytest.raises(HttpError) as err:
        PoliteClient(policy).get(server.url("/busy.jpg"), use_cache=False)
    assert err.value.reason == "retries_exhausted" and err.value.status == 503, err.value
    assert "no time left for a retry in the request's 2.5 s" in err.value.detail, err.value
    assert 1 <= len(server.hits) < 6, server.paths()
    fault_stats.add(faults_injected=len(server.hits), invariant_checks=2)


def _deadline_timers() -> list[threading.Thread]:
    from pipelines.web.deadline import TIMER_NAME

    return [t for t in threading.enumerate() if t.name == TIMER_NAME]


def _issue_tls(folder, name: str) -> tuple[ssl.SSLContext, str]:
    """A server context whose certificate names ``name`` (an IP address or a DNS name), and the
    file of the CA that issued it, made with ``openssl`` in ``folder``."""
    if shutil.which("openssl") is None:
        missing_tool("openssl is not installed (it makes the test certificate); .ci/run installs it")
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=mmlinks test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "leaf.csr",
            "-subj", f"/CN={name}")  # fmt: skip
    kind = "IP" if name.replace(".", "").isdigit() else "DNS"
    (folder / "leaf.ext").write_text(
        f"subjectAltName={kind}:{name}\nbasicConstraints=CA:FALSE\nauthorityKeyIdentifier=keyid\n"
        "extendedKeyUsage=serverAuth\n"
    )
    openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "cert.pem", "-days", "2", "-extfile", "leaf.ext")  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    return context, str(folder / "ca.pem")


@pytest.fixture
def tls(tmp_path, monkeypatch) -> tuple[ssl.SSLContext, str]:
    """A server context for 127.0.0.1 and the CA file that verifies it, made with ``openssl``.
    The environment's CA bundle variables would override a session's ``verify``."""
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    return _issue_tls(tmp_path / "tls", "127.0.0.1")


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_pooled_connection_is_cut_at_the_deadline_and_the_client_recovers(
    serve,  # noqa: F811
    scheme,
    request,
    fault_stats,
):
    """Keep-alive (HTTP/1.1): a fast request, then dripping headers on the same pooled, already
    connected connection (the deadline must still reach its socket, also once TLS wraps it),
    then a fast request again on the same client, which must get its whole response (no dead
    connection handed back)."""
    stop, dripped, peers = threading.Event(), [], []

    def fast(h):
        peers.append(h.client_address)
        send(h, 200, BODY)

    drip = _header_drip(stop, dripped)

    def slow(h):
        peers.append(h.client_address)
        drip(h)

    from tests.pipelines.test_http_client import sequence

    context, ca_file = request.getfixturevalue("tls") if scheme == "https" else (None, None)
    server = serve(sequence(fast, slow, fast), protocol="HTTP/1.1", tls=context)
    client = make_client(server, max_retries=0, max_seconds=1.5, timeout=0.5)
    if ca_file:
        client.session.verify = ca_file  # the session of this thread, the one get() uses
    try:
        assert client.get(server.url("/1.jpg"), use_cache=False).body == BODY
        with pytest.raises(HttpError) as err:
            client.get(server.url("/2.jpg"), use_cache=False)
        assert "download took over 1.5 s" in err.value.detail, err.value
        resp = client.get(server.url("/3.jpg"), use_cache=False)
        assert resp.status == 200 and resp.body == BODY
        _wait_for(lambda: dripped)
        assert dripped and dripped[0] < DRIP_BYTES, dripped
    finally:
        stop.set()
    assert server.paths() == ["/1.jpg", "/2.jpg", "/3.jpg"]
    assert peers[0] == peers[1], peers  # the dripping request came over the pooled connection
    _wait_for(lambda: not _deadline_timers())
    assert not _deadline_timers()  # every request's timer ended with it
    fault_stats.add(faults_injected=1, invariant_checks=2)


def test_a_fast_request_outlives_its_deadline_timer_unharmed(serve):  # noqa: F811
    """A request that ends in time cancels its timer: the pooled connection it leaves behind is
    not shut down when its deadline would have passed, and the next request reuses it."""
    peers = []

    def fast(h):
        peers.append(h.client_address)
        send(h, 200, BODY)

    server = serve(fast, protocol="HTTP/1.1")
    client = make_client(server, max_retries=0, max_seconds=0.3, timeout=5.0)
    assert client.get(server.url("/1.jpg"), use_cache=False).body == BODY
    time.sleep(0.6)  # past the first request's deadline
    assert client.get(server.url("/2.jpg"), use_cache=False).body == BODY
    assert peers[0] == peers[1], peers  # the same connection, still open
    _wait_for(lambda: not _deadline_timers())
    assert not _deadline_timers()


# ---------------------------------------------------------------------------- DNS rebinding

PUBLIC_IP = "93.184.216.34"  # a global address the guard accepts; no test connects to it
REBIND_HOST = "rebind.test"


@pytest.fixture
def rebinding_dns(monkeypatch) -> list[str]:
    """The resolver at the socket layer (``socket.getaddrinfo``, which urllib3 and the guard
    both call) answers ``REBIND_HOST`` with ``PUBLIC_IP`` on its first lookup and 127.0.0.1 on
    every later one: a DNS rebinding attack with a zero TTL. Other names resolve as usual.
    Returns the answers given, one per lookup of ``REBIND_HOST``."""
    real = socket.getaddrinfo
    answers: list[str] = []

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name.rstrip(".").lower() != REBIND_HOST:
            return real(host, port, family, type, proto, flags)
        answers.append(PUBLIC_IP if not answers else "127.0.0.1")
        return real(answers[-1], port, socket.AF_INET, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_rebinding_dns_answer_never_reaches_loopback(serve, scheme, rebinding_dns, request, fault_stats):  # noqa: F811
    """The guard checks the host's address before the request (a public answer); the name
    then rebinds to 127.0.0.1. The connection must not look the name up again and connect to
    whatever it gets: the answer it connects to is the one checked, so the request is refused
    with the guard's ``private_address`` and the loopback server never sees it. Found by this
    test: requests resolved the name again to connect and fetched from the loopback server."""
    context = request.getfixturevalue("tls")[0] if scheme == "https" else None
    server = serve(lambda h: send(h, 200, b"internal secret"), tls=context)
    client = make_client(
        allowed_hosts=frozenset({REBIND_HOST}), allow_private=False, max_retries=2, timeout=2.0
    )
    with pytest.raises(HttpError) as err:
        client.get(f"{scheme}://{REBIND_HOST}:{server.port}/latest/meta-data/", use_cache=False)
    assert err.value.reason == "private_address" and not err.value.transient, err.value
    assert "127.0.0.1" in err.value.detail, err.value
    assert server.hits == []
    # The guard's own look-up saw the public answer; the connection's look-up (the only other
    # one: no retry, no third resolution) is the one refused.
    assert rebinding_dns == [PUBLIC_IP, "127.0.0.1"], rebinding_dns
    fault_stats.add(faults_injected=1, invariant_checks=3)


def test_the_image_fetcher_checks_the_address_it_connects_to(serve, monkeypatch, fault_stats):  # noqa: F811
    """``HttpFetcher`` (the image store's plain fetcher, no allowlist) refuses a name that
    resolves to loopback, on the one look-up its connection makes, and never sends the request.
    Before, it had no address check at all."""
    from pipelines.image_fetch import FETCH_FAILED, FetchFailed, HttpFetcher

    real, looked_up = socket.getaddrinfo, []

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        if host == REBIND_HOST:
            looked_up.append(host)
            host = "127.0.0.1"
        return real(host, port, family, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    server = serve(lambda h: send(h, 200, b"internal secret"))
    with pytest.raises(FetchFailed) as err:
        HttpFetcher(timeout=(2.0, 2.0)).fetch(f"http://{REBIND_HOST}:{server.port}/a.jpg", 1 << 20)
    assert err.value.reason == FETCH_FAILED and err.value.transient, err.value
    assert "private_address" in err.value.detail, err.value
    assert server.hits == [] and looked_up == [REBIND_HOST]
    fault_stats.add(faults_injected=1, invariant_checks=2)


@pytest.mark.parametrize("cert_name", ["pinned.test", "other.test"])
def test_a_pinned_https_connection_keeps_sni_host_and_certificate_check_on_the_name(
    serve,  # noqa: F811
    cert_name,
    tmp_path,
    monkeypatch,
):
    """Connecting to the checked address, not the name, must not move TLS onto the address:
    the server sees SNI and Host ``pinned.test``, and the certificate is verified against that
    name (one issued for another name is refused before any request is sent). ``allow_private``
    lets the loopback server be reached: the connection takes the same pinned path, without
    the address check. The name is looked up once per connection."""
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    context, ca_file = _issue_tls(tmp_path / "tls", cert_name)
    sni: list[str | None] = []
    context.sni_callback = lambda _sock, name, _ctx: sni.append(name)
    real, looked_up = socket.getaddrinfo, []

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        if host == "pinned.test":
            looked_up.append(host)
            return real("127.0.0.1", port, socket.AF_INET, type, proto, flags)
        return real(host, port, family, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    server = serve(lambda h: send(h, 200, b"over tls"), tls=context)
    client = make_client(allowed_hosts=frozenset({"pinned.test"}), allow_private=True, max_retries=0)
    client.session.verify = ca_file  # the session of this thread, the one get() uses
    url = f"https://pinned.test:{server.port}/x"
    if cert_name == "pinned.test":
        resp = client.get(url, use_cache=False)
        assert resp.status == 200 and resp.body == b"over tls"
        assert server.hits[0].headers["host"] == f"pinned.test:{server.port}"
    else:
        with pytest.raises(HttpError) as err:
            client.get(url, use_cache=False)
        assert err.value.reason == "retries_exhausted" and "SSLError" in err.value.detail, err.value
        assert "pinned.test" in err.value.detail, err.value  # the name it was checked against
        assert server.hits == []
    assert sni == ["pinned.test"] and looked_up == ["pinned.test"], (sni, looked_up)


# ---------------------------------------------------------------------------- proxies

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture
def environment_proxy(serve, monkeypatch):  # noqa: F811
    """A loopback server standing in for a forward proxy (it answers every request itself),
    named by every proxy variable of the environment, with no NO_PROXY exception."""
    proxy = serve(lambda h: send(h, 200, b"internal secret, through the proxy"))
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    return proxy


def test_an_environment_proxy_does_not_switch_the_pinning_off(
    serve,  # noqa: F811
    environment_proxy,
    rebinding_dns,
    fault_stats,
):
    """Issue #46: with ``HTTP_PROXY`` set, requests sent the request to the proxy, whose
    connection is not pinned (the proxy resolves the name itself), so the rebinding name got
    through: 200 and the proxy's body. Proxies now come only from the policy: the connection
    goes direct, resolves once, and the rebinding answer is refused; the proxy sees nothing."""
    server = serve(lambda h: send(h, 200, b"internal secret"))
    client = make_client(allowed_hosts=frozenset({REBIND_HOST}), allow_private=False, max_retries=0)
    with pytest.raises(HttpError) as err:
        client.get(f"http://{REBIND_HOST}:{server.port}/latest/meta-data/", use_cache=False)
    assert err.value.reason == "private_address" and "127.0.0.1" in err.value.detail, err.value
    assert environment_proxy.hits == [] and server.hits == []
    fault_stats.add(faults_injected=1, invariant_checks=2)


def test_the_image_fetcher_ignores_an_environment_proxy(serve, environment_proxy, monkeypatch, fault_stats):  # noqa: F811
    from pipelines.image_fetch import FetchFailed, HttpFetcher

    real = socket.getaddrinfo

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        return real("127.0.0.1" if host == REBIND_HOST else host, port, family, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(FetchFailed) as err:
        HttpFetcher(timeout=(2.0, 2.0)).fetch(f"http://{REBIND_HOST}:9/a.jpg", 1 << 20)
    assert "private_address" in err.value.detail, err.value
    assert environment_proxy.hits == []
    fault_stats.add(faults_injected=1, invariant_checks=2)


def test_an_explicit_proxy_is_used_and_a_bad_one_is_refused_without_echoing_it(serve):  # noqa: F811
    """A proxy is an option (``HttpPolicy.proxy``, ``HttpFetcher(proxy=)``, the sources'
    ``proxy`` option), used for http and https; anything but an http(s) URL is one clear error
    that does not print the URL (it may hold a password)."""
    from pipelines.image_fetch import HttpFetcher
    from schemas.errors import MmlinksError

    proxy = serve(lambda h: send(h, 200, b"via proxy"))
    client = make_client(allowed_hosts=frozenset({"origin.test"}), proxy=f"http://127.0.0.1:{proxy.port}")
    assert client.get("http://origin.test/x", use_cache=False).body == b"via proxy"
    fetched = HttpFetcher(allow_private=True, proxy=f"http://127.0.0.1:{proxy.port}").fetch(
        "http://origin.test/y.jpg", 1 << 20
    )
    assert fetched.data == b"via proxy"
    assert proxy.paths() == ["http://origin.test/x", "http://origin.test/y.jpg"]
    for bad in ("socks5://user:s3cret@proxy:1080", "proxy:3128", "http://user:s3cret@proxy:99999"):
        with pytest.raises(MmlinksError) as err:
            make_client(allowed_hosts=frozenset({"origin.test"}), proxy=bad)
        assert "s3cret" not in str(err.value) and "http://" in str(err.value)
