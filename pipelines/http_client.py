"""A polite HTTP client shared by every web connector (imgur, Reddit API, MediaWiki).

Crawling other people's servers for a dataset must not hurt them or us, so every request goes
through the same rules:

- **Allowlist.** Only the hosts a source needs (``host`` = any port, ``host:port`` = that port,
  ``*.example.com`` = any subdomain). Redirects are followed by hand and every hop is checked, so
  a redirect to another host is refused like a direct request. Unless ``allow_private``, a host
  that resolves to a loopback/private/link-local/reserved/multicast address is refused too (a
  crawled URL must not reach into our own network). The address is checked before connecting;
  DNS rebinding between the check and the connect is not defended against.
- **Rate and concurrency.** ``rate_per_host`` is a minimum spacing between request starts to a
  host. With ``state_dir`` the spacing is shared by every process on this machine through one
  ``flock``-ed file per host (Beam's DirectRunner runs a worker process per core); without it,
  by the threads of this process. At most ``max_concurrency_per_host`` requests per host are in
  flight per process.
- **Retries.** 408/429/500/502/503/504, timeouts, connection errors and imgur's "over capacity"
  403 are retried at most ``max_retries`` times with exponential backoff and full jitter. A
  server's own ``Retry-After`` wins; a demand longer than ``backoff_max`` is not waited out: the
  request fails at once as transient (the item is retried by a later crawl, not by a sleeping
  worker). Rate-limit headers that say the budget is spent pause the host until the reset.
  No pause or block a server asks for (``Retry-After``, a rate-limit reset) reaches further
  than ``MAX_BLOCK_S`` (one hour) from now: blocks persist in the gate files across builds,
  and a server (or a clock) naming next year must not shut a host out of every later build.
- **Limits.** Bodies are streamed and capped at ``max_bytes`` (``too_large``); a whole download
  is bounded by ``max_seconds``.
- **Cache.** 200 and 404/410 responses are kept on disk (any Beam FileSystems URI) keyed by the
  request, never including credentials, so a rerun of a crawl does not ask again.

Request headers are never logged (they may carry credentials) and logged URLs lose their query.
"""

from __future__ import annotations

import dataclasses
import email.utils
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import random
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests

from pipelines import fileio
from pipelines.sources.base import SourceContext, SourceOption
from schemas.errors import MmlinksError

log = logging.getLogger(__name__)

RATE_MARGIN = 1.05  # request starts are spaced RATE_MARGIN / rate apart
DEFAULT_USER_AGENT = "mmlinks/0.1 (research crawler; +https://github.com/mmlinks/mmlinks)"

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
CACHEABLE_STATUSES = frozenset({200, 404, 410})
# Never part of a cache key or a cache file: they identify a user, not a resource.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
_NOT_STORED_RESPONSE_HEADERS = frozenset({"set-cookie", "set-cookie2"})
_CACHE_MAGIC = b"mmlinks-http-cache/1\n"
# The longest pause or block of a host a server's Retry-After or rate-limit reset can cause,
# and the longest a block read back from a gate file is honoured (seconds from now).
MAX_BLOCK_S = 3600.0
_CHUNK = 64 * 1024


class HttpError(MmlinksError):
    """A request that cannot succeed (now). ``reason`` is a dead-letter reason:

    ``refused_host`` (not on the allowlist, including a redirect to another host),
    ``private_address`` (host resolves to a loopback/private/link-local address),
    ``too_large`` (over the byte limit), ``retries_exhausted`` (429/5xx/timeouts until the
    retry budget ran out; ``transient`` is True), ``too_many_redirects``, ``bad_url``.
    """

    def __init__(self, reason: str, detail: str, *, transient: bool = False, status: int | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.transient = transient
        self.status = status


@dataclass(frozen=True)
class HttpPolicy:
    """How politely to talk to hosts. ``rate_per_host=None`` switches rate limiting off."""

    allowed_hosts: frozenset[str]  # "host", "host:port" or "*.domain"; redirects must stay inside
    user_agent: str = DEFAULT_USER_AGENT
    rate_per_host: float | None = 1.0  # requests per second per host, across this machine's processes
    max_concurrency_per_host: int = 2  # requests in flight per host in one process
    max_retries: int = 5  # retries on 429, 5xx, 408, timeouts and connection errors
    backoff_base: float = 1.0  # seconds; exponential with full jitter
    backoff_max: float = 60.0  # longest single wait (Retry-After above it: give up, transient)
    timeout: float = 30.0  # seconds per socket operation
    max_bytes: int = 16 * 1024 * 1024  # per response body
    max_redirects: int = 5
    cache_dir: str | None = None  # on-disk response cache (Beam FileSystems URI); None: off
    cache_ttl: float | None = None  # seconds a cached response stays fresh; None: forever
    allow_private: bool = False  # tests against a loopback fixture server set this
    state_dir: str | None = None  # local folder for the cross-process rate limiter; None: per process
    extra: dict[str, Any] = field(default_factory=dict)
    # Fixture servers and benchmarks: a wait above backoff_max is cut to backoff_max instead of
    # failing the request (the server is ours; politeness is not the point).
    clamp_waits: bool = False
    max_seconds: float | None = 300.0  # bound on one whole download (a server that drips bytes)


@dataclass
class HttpResponse:
    url: str  # final URL after (allowed) redirects
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes
    from_cache: bool = False

    def json(self) -> Any:
        return json.loads(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


# --------------------------------------------------------------------------- small pure helpers


def backoff_delay(attempt: int, base: float, cap: float, rng: Callable[[], float] = random.random) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)].

    Full jitter spreads the retries of many workers that failed together (AWS architecture
    blog, "Exponential Backoff And Jitter"), instead of having them hit the host again in step.
    """
    if attempt < 0 or base < 0 or cap < 0:
        raise ValueError("attempt, base and cap must be non-negative")
    ceiling = min(cap, base * 2.0 ** min(attempt, 64))
    return ceiling * min(max(rng(), 0.0), 1.0)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP-date), or None."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT ("-0000" parses as naive)
            when = when.replace(tzinfo=UTC)
        return max(0.0, when.timestamp() - now)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return None
    return max(0.0, seconds)


def _num(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        out = float(value.strip())
    except ValueError:
        return None
    return out if out == out and abs(out) != float("inf") else None


def rate_limit_reset(headers: dict[str, str], now: float) -> float | None:
    """Seconds until a spent rate-limit budget resets, or None when the budget is not spent.

    Reddit: ``x-ratelimit-remaining`` (a float) and ``x-ratelimit-reset`` (seconds). GitHub-like
    APIs: ``x-ratelimit-reset`` as epoch seconds (told apart by size). Imgur:
    ``x-ratelimit-userremaining``/``x-ratelimit-clientremaining`` with ``x-ratelimit-userreset``
    (epoch seconds). A spent budget with no usable reset returns ``inf`` (caller bounds it).
    """
    h = headers
    remaining = _num(h.get("x-ratelimit-remaining"))
    if remaining is not None and remaining <= 0:
        reset = _num(h.get("x-ratelimit-reset"))
        if reset is None:
            return float("inf")
        return max(0.0, reset - now) if reset > 1e9 else max(0.0, reset)
    user = _num(h.get("x-ratelimit-userremaining"))
    if user is not None and user <= 0:
        reset = _num(h.get("x-ratelimit-userreset"))
        if reset is None:
            return float("inf")
        return max(0.0, reset - now) if reset > 1e9 else max(0.0, reset)
    client = _num(h.get("x-ratelimit-clientremaining"))
    if client is not None and client <= 0:
        return float("inf")  # imgur's client budget resets daily and it gives no time for it
    return None


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def _split_host(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL; HttpError bad_url otherwise."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:  # bad port, bad IPv6 literal
        raise HttpError("bad_url", f"{_redact(url)}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise HttpError("bad_url", f"only http and https, not {scheme or 'no scheme'}: {_redact(url)}")
    if not host:
        raise HttpError("bad_url", f"no host: {_redact(url)}")
    return scheme, host.lower().rstrip("."), port or _default_port(scheme)


def _parse_allow_entry(entry: str) -> tuple[str, int | None]:
    if "@" in entry:  # never echoed: the part before "@" may be a password or a token
        raise MmlinksError(
            "an allowlist entry carries user info (user:password@host); credentials belong in "
            "the environment, not in a host or base URL"
        )
    entry = entry.strip().lower()
    if entry.startswith("*."):
        return entry, None
    try:
        parts = urlsplit("//" + entry)
        host, port = parts.hostname, parts.port
    except ValueError:
        raise MmlinksError(f"bad allowlist entry {entry!r} (want host, host:port or *.domain)") from None
    if not host:
        raise MmlinksError(f"bad allowlist entry {entry!r} (want host, host:port or *.domain)")
    return host.rstrip("."), port


def host_allowed(allowed_hosts: frozenset[str] | set[str], host: str, port: int) -> bool:
    """Whether ``host:port`` is on the allowlist (entries: ``host``, ``host:port``, ``*.domain``)."""
    host = host.lower().rstrip(".")
    for entry in allowed_hosts:
        name, want_port = _parse_allow_entry(entry)
        if name.startswith("*."):
            if host.endswith(name[1:]) and len(host) > len(name) - 1:
                return True
        elif name == host and (want_port is None or want_port == port):
            return True
    return False


def _address_refused(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
        or not ip.is_global
    )


def check_public_host(host: str, port: int) -> None:
    """Raise HttpError private_address when ``host`` is or resolves to a non-public address.

    A resolution failure is an OSError (socket.gaierror), which the caller treats as a
    connection error (transient).
    """
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    for ip in addresses:
        if _address_refused(ip):
            raise HttpError("private_address", f"{host} resolves to non-public address {ip}")


def _scrub(message: str) -> str:
    """An exception message without URL queries (requests quotes the URL, query and all)."""
    return re.sub(r"\?[^\s'\")]*", "?...", message)


def redact_url(url: str) -> str:
    """The URL without user info, query or fragment, for logs and messages (they may hold keys)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


_redact = redact_url


# --------------------------------------------------------------------------- per-host gate


@dataclass
class _GateState:
    not_before: float = 0.0  # next request start allowed (spacing and pauses)
    blocked_until: float = 0.0  # requests fail at once until then (a reset beyond backoff_max)
    last_start: float = 0.0  # when the latest request actually started


class _HostGate:
    """Request-start spacing, pauses and blocks for one host in one limiter domain.

    The domain is the machine (a flock-ed JSON file under ``state_dir``) or, without a
    state_dir, this process. A reservation advances ``not_before`` under the lock and the
    caller sleeps outside it, so waiting never holds the lock.
    """

    def __init__(self, state_dir: str | None, host_key: str):
        self.lock = threading.Lock()
        self.memory = _GateState()
        self.path = None
        if state_dir:
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", host_key)
            self.path = os.path.join(state_dir, f"{safe}.gate.json")
            os.makedirs(state_dir, exist_ok=True)

    def _update(self, fn: Callable[[_GateState], Any]) -> Any:
        with self.lock:
            if self.path is None:
                return fn(self.memory)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            with os.fdopen(fd, "r+b") as fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)  # released when the file closes
                raw = fh.read()
                try:
                    data = json.loads(raw) if raw else {}
                    state = _GateState(
                        float(data.get("not_before", 0.0)),
                        float(data.get("blocked_until", 0.0)),
                        float(data.get("last_start", 0.0)),
                    )
                except (ValueError, TypeError, AttributeError):
                    state = _GateState()  # a torn file (crash mid-write): start afresh
                result = fn(state)
                fh.seek(0)
                fh.truncate()
                fh.write(json.dumps(dataclasses.asdict(state)).encode())
                fh.flush()
            return result

    def reserve(self, now: float, interval: float | None) -> tuple[float, float]:
        """(start time for this request, blocked_until); start == -1 when blocked.

        A block reaching beyond ``MAX_BLOCK_S`` from now (a gate file from an older build, or
        another process's clock) is cut back to that.
        """

        def fn(s: _GateState):
            s.blocked_until = min(s.blocked_until, now + MAX_BLOCK_S)
            if s.blocked_until > now:
                return -1.0, s.blocked_until
            start = max(now, s.not_before)
            if interval:
                s.not_before = start + interval
            return start, 0.0

        return self._update(fn)

    def confirm(self, now: float, interval: float) -> float | None:
        """Record an actual start at ``now``, or return when to try again.

        Reservations space the *planned* starts; a thread that wakes late (GIL, a busy core)
        would otherwise start right before the next slot's owner. Checking the previous actual
        start keeps the real starts ``interval`` apart too.
        """

        def fn(s: _GateState):
            if now + 1e-6 < s.last_start + interval:
                return s.last_start + interval
            s.last_start = now
            return None

        return self._update(fn)

    def pause(self, until: float) -> None:
        def fn(s: _GateState):
            s.not_before = max(s.not_before, until)

        self._update(fn)

    def block(self, until: float) -> None:
        def fn(s: _GateState):
            s.blocked_until = max(s.blocked_until, until)

        self._update(fn)


_GATES: dict[tuple[str | None, str], _HostGate] = {}
_SEMAPHORES: dict[tuple[str | None, str, int], threading.BoundedSemaphore] = {}
_REGISTRY_LOCK = threading.Lock()


def _gate(state_dir: str | None, host_key: str) -> _HostGate:
    # Process-wide, so every client in a process (several DoFn instances) shares one gate.
    with _REGISTRY_LOCK:
        key = (state_dir, host_key)
        if key not in _GATES:
            _GATES[key] = _HostGate(state_dir, host_key)
        return _GATES[key]


def _semaphore(state_dir: str | None, host_key: str, n: int) -> threading.BoundedSemaphore:
    with _REGISTRY_LOCK:
        key = (state_dir, host_key, n)
        if key not in _SEMAPHORES:
            _SEMAPHORES[key] = threading.BoundedSemaphore(max(1, n))
        return _SEMAPHORES[key]


# --------------------------------------------------------------------------- cache


def cache_key(url: str, headers: dict[str, str] | None) -> str:
    """sha256 over the method, the full request URL and the non-credential request headers."""
    kept = sorted((k.lower(), v) for k, v in (headers or {}).items() if k.lower() not in CREDENTIAL_HEADERS)
    return hashlib.sha256(json.dumps(["GET", url, kept]).encode()).hexdigest()


def _encode_cache(resp: HttpResponse, stored_at: float) -> bytes:
    meta = {
        "url": resp.url,
        "status": resp.status,
        "headers": {k: v for k, v in resp.headers.items() if k not in _NOT_STORED_RESPONSE_HEADERS},
        "stored_at": stored_at,
        "length": len(resp.body),
    }
    return _CACHE_MAGIC + json.dumps(meta, sort_keys=True).encode() + b"\n" + resp.body


def _decode_cache(data: bytes) -> tuple[HttpResponse, float] | None:
    """(response, stored_at), or None for anything that is not a whole cache entry."""
    if not data.startswith(_CACHE_MAGIC):
        return None
    meta_line, sep, body = data[len(_CACHE_MAGIC) :].partition(b"\n")
    if not sep:
        return None
    try:
        meta = json.loads(meta_line)
        if len(body) != int(meta["length"]):
            return None
        headers = {str(k): str(v) for k, v in dict(meta["headers"]).items()}
        resp = HttpResponse(str(meta["url"]), int(meta["status"]), headers, body, from_cache=True)
        return resp, float(meta["stored_at"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


# --------------------------------------------------------------------------- the client


class PoliteClient:
    """GET with politeness. Picklable (the session is created lazily, per process and thread).

    ``get`` returns the final response for 2xx, 3xx-without-location and 4xx other than
    408/429 (callers turn 404/410 into ``not_found`` dead letters); it retries 408/429/5xx,
    timeouts and connection errors with backoff, and raises ``HttpError`` for what policy refuses
    or when retries are exhausted.

    ``sleep``, ``clock`` (wall-clock seconds; shared with other processes through the gate
    files) and ``rng`` (uniform [0, 1)) can be injected so tests of backoff run instantly.
    """

    def __init__(
        self,
        policy: HttpPolicy,
        *,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] | None = None,
        rng: Callable[[], float] | None = None,
    ):
        if policy.rate_per_host is not None and not policy.rate_per_host > 0:
            raise MmlinksError(f"rate_per_host must be positive or None, not {policy.rate_per_host}")
        if policy.max_retries < 0:
            raise MmlinksError("max_retries must be >= 0")
        for entry in policy.allowed_hosts:
            _parse_allow_entry(entry)  # a bad entry fails here, not on the first request
        self.policy = policy
        self.sleep = sleep
        self.clock = clock
        self.rng = rng
        self._local = threading.local()

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_local", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()

    @property
    def session(self) -> requests.Session:
        # One session per thread: requests.Session is not documented as thread-safe.
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            s.headers["User-Agent"] = self.policy.user_agent
            self._local.session = s
        return s

    # -- time
    def _now(self) -> float:
        return (self.clock or time.time)()

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            (self.sleep or time.sleep)(seconds)

    def _jitter(self) -> float:
        return (self.rng or random.random)()

    # -- public
    def get(
        self,
        url: str,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        max_bytes: int | None = None,
        use_cache: bool = True,
    ) -> HttpResponse:
        limit = self.policy.max_bytes if max_bytes is None else max_bytes
        try:
            full_url = requests.Request("GET", url, params=params).prepare().url
        except (requests.exceptions.RequestException, ValueError) as exc:
            raise HttpError("bad_url", f"{_redact(str(url))}: {type(exc).__name__}") from None
        _scheme, host, port = _split_host(full_url)
        self._check_host(host, port)
        cache_uri = None
        if use_cache and self.policy.cache_dir:
            key = cache_key(full_url, headers)
            cache_uri = fileio.join(self.policy.cache_dir, key[:2], f"{key}.http")
            hit = self._cache_read(cache_uri, limit)
            if hit is not None:
                return hit
        resp = self._follow(full_url, dict(headers or {}), limit)
        if cache_uri is not None and resp.status in CACHEABLE_STATUSES:
            try:
                fileio.write_bytes_atomic(cache_uri, _encode_cache(resp, self._now()))
            except OSError as exc:  # a full disk or a bucket hiccup must not fail the request
                log.warning("http cache write failed for %s: %s", _redact(full_url), exc)
        return resp

    # -- internals
    def _check_host(self, host: str, port: int) -> None:
        if not host_allowed(self.policy.allowed_hosts, host, port):
            raise HttpError("refused_host", f"{host}:{port} is not on the allowlist")

    def _cache_read(self, uri: str, limit: int) -> HttpResponse | None:
        try:
            data = fileio.read_bytes(uri)
        except OSError:  # missing (FileNotFoundError) or unreadable: a miss
            return None
        decoded = _decode_cache(data)
        if decoded is None:
            log.info("ignoring a corrupt http cache entry %s", uri)
            return None
        resp, stored_at = decoded
        ttl = self.policy.cache_ttl
        if ttl is not None and self._now() - stored_at > ttl:
            return None
        try:
            _s, host, port = _split_host(resp.url)
            self._check_host(host, port)  # the allowlist may have narrowed since
        except HttpError:
            return None
        if len(resp.body) > limit:
            raise HttpError(
                "too_large", f"cached body of {len(resp.body)} bytes > {limit}", status=resp.status
            )
        return resp

    def _follow(self, url: str, headers: dict[str, str], limit: int) -> HttpResponse:
        """Follow redirects by hand, checking every hop against the allowlist."""
        first_scheme, *first_origin = _split_host(url)
        for _hop in range(self.policy.max_redirects + 1):
            scheme, host, port = _split_host(url)
            self._check_host(host, port)
            # Credentials are for the origin they were meant for, and never go out unencrypted.
            if [host, port] != first_origin or (first_scheme == "https" and scheme == "http"):
                headers = {k: v for k, v in headers.items() if k.lower() not in CREDENTIAL_HEADERS}
            resp = self._get_with_retries(url, host, port, headers, limit)
            location = resp.headers.get("location")
            if resp.status in REDIRECT_STATUSES and location:
                url = urljoin(url, location)
                continue
            return resp
        raise HttpError("too_many_redirects", f"more than {self.policy.max_redirects}: {_redact(url)}")

    def _get_with_retries(
        self, url: str, host: str, port: int, headers: dict[str, str], limit: int
    ) -> HttpResponse:
        p = self.policy
        host_key = f"{host}:{port}"
        gate = _gate(p.state_dir, host_key)
        last = "no attempt"
        last_status: int | None = None
        for attempt in range(p.max_retries + 1):
            try:
                resp = self._attempt(url, host, port, host_key, gate, headers, limit)
            except _Transient as exc:
                last, last_status = exc.detail, None
                wait = backoff_delay(attempt, p.backoff_base, p.backoff_max, self._jitter)
            else:
                self._note_rate_limit(gate, resp.headers, host_key)
                if not _should_retry(resp):
                    return resp
                last, last_status = f"HTTP {resp.status}", resp.status
                demanded = parse_retry_after(resp.headers.get("retry-after"), self._now())
                if demanded is not None:
                    if demanded > p.backoff_max and not p.clamp_waits:
                        if resp.status == 429:  # "too many requests" is about the host: stop asking
                            gate.block(self._now() + min(demanded, MAX_BLOCK_S))
                        raise HttpError(
                            "retries_exhausted",
                            f"{_redact(url)}: {last} with Retry-After {demanded:g} s > {p.backoff_max:g} s",
                            transient=True,
                            status=last_status,
                        )
                    wait = min(demanded, p.backoff_max, MAX_BLOCK_S)
                    gate.pause(self._now() + wait)  # the whole host, for every worker
                else:
                    wait = backoff_delay(attempt, p.backoff_base, p.backoff_max, self._jitter)
            if attempt == p.max_retries:
                break
            log.info("retry %d/%d of %s in %.2f s (%s)", attempt + 1, p.max_retries, _redact(url), wait, last)
            self._sleep(wait)
        raise HttpError(
            "retries_exhausted",
            f"{_redact(url)}: {last} after {p.max_retries + 1} attempts",
            transient=True,
            status=last_status,
        )

    def _note_rate_limit(self, gate: _HostGate, headers: dict[str, str], host_key: str) -> None:
        now = self._now()
        reset = rate_limit_reset(headers, now)
        if reset is None:
            return
        p = self.policy
        if reset > p.backoff_max and not p.clamp_waits:
            horizon = min(reset, MAX_BLOCK_S)  # also when no reset time was given (inf)
            log.warning("rate-limit budget of %s spent; refusing requests for %.0f s", host_key, horizon)
            gate.block(now + horizon)
        else:
            gate.pause(now + min(reset, p.backoff_max, MAX_BLOCK_S))

    def _attempt(
        self,
        url: str,
        host: str,
        port: int,
        host_key: str,
        gate: _HostGate,
        headers: dict[str, str],
        limit: int,
    ) -> HttpResponse:
        """One request: address check, concurrency slot, rate slot, streamed capped read."""
        p = self.policy
        if not p.allow_private:
            try:
                check_public_host(host, port)
            except OSError as exc:
                raise _Transient(f"cannot resolve {host}: {exc}") from None
        sem = _semaphore(p.state_dir, host_key, p.max_concurrency_per_host)
        with sem:
            # 5% above the exact spacing: a server timing our requests with a few ms of jitter
            # must never count rate + 1 of them in one second.
            interval = RATE_MARGIN / p.rate_per_host if p.rate_per_host else None
            now = self._now()
            start, blocked_until = gate.reserve(now, interval)
            if start < 0:
                raise HttpError(
                    "retries_exhausted",
                    f"{host_key} rate-limit budget spent for {blocked_until - now:.0f} s more",
                    transient=True,
                )
            self._sleep(start - now)
            while interval:
                retry_at = gate.confirm(self._now(), interval)
                if retry_at is None:
                    break
                self._sleep(retry_at - self._now())
            try:
                return self._send(url, headers, limit)
            except (
                requests.Timeout,
                requests.ConnectionError,
                requests.exceptions.ChunkedEncodingError,
            ) as exc:
                raise _Transient(_scrub(f"{type(exc).__name__}: {exc}")[:300]) from None
            except requests.exceptions.RequestException as exc:  # invalid URL/header, ...
                raise HttpError("bad_url", f"{_redact(url)}: {type(exc).__name__}") from None

    def _send(self, url: str, headers: dict[str, str], limit: int) -> HttpResponse:
        resp = self.session.get(
            url, headers=headers, timeout=self.policy.timeout, stream=True, allow_redirects=False
        )
        with resp:
            status = resp.status_code
            out_headers = {k.lower(): v for k, v in resp.headers.items()}
            if status in REDIRECT_STATUSES and out_headers.get("location"):
                return HttpResponse(url, status, out_headers, b"")
            length = out_headers.get("content-length", "")
            if length.isdigit() and int(length) > limit:
                raise HttpError(
                    "too_large", f"Content-Length {length} > {limit} bytes: {_redact(url)}", status=status
                )
            buf = bytearray()
            deadline = time.monotonic() + self.policy.max_seconds if self.policy.max_seconds else None
            for chunk in resp.iter_content(_CHUNK):
                buf += chunk
                if len(buf) > limit:
                    raise HttpError("too_large", f"more than {limit} bytes: {_redact(url)}", status=status)
                if deadline is not None and time.monotonic() > deadline:
                    raise _Transient(f"download took over {self.policy.max_seconds:g} s")
        return HttpResponse(url, status, out_headers, bytes(buf))


class _Transient(Exception):
    """Internal: a failed attempt worth retrying (timeout, connection error, DNS failure)."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def _should_retry(resp: HttpResponse) -> bool:
    if resp.status in RETRY_STATUSES:
        return True
    # imgur answers 403 with "Imgur is over capacity!" when it sheds load; it is not a ban.
    return resp.status == 403 and b"over capacity" in resp.body[:4096].lower()


# --------------------------------------------------------------------------- source options


def http_source_options() -> tuple[SourceOption, ...]:
    """The politeness options every web source offers (none of them changes the documents)."""
    table = (
        ("rate", "1", "requests per second per host, all workers together ('none': unlimited)"),
        ("concurrency", "2", "requests in flight per host per worker process"),
        ("retries", "5", "retries on 429/5xx/timeouts (exponential backoff with jitter)"),
        ("backoff_max", "60", "longest wait in seconds; a longer Retry-After fails the item for now"),
        ("http_cache", None, "response cache folder (default: under the crawl state); 'off'"),
        ("polite", "true", "false: no rate limit, waits cut to 0.1 s (fixture servers only)"),
        ("allow_private", "false", "allow loopback/private addresses (test fixture servers)"),
    )
    return tuple(SourceOption(name, default, text, defines_data=False) for name, default, text in table)


def _rate_dir(ctx: SourceContext) -> str:
    if fileio.is_local(ctx.state_dir):
        return fileio.normalize(ctx.state("http-rate"))
    # The limiter needs flock, i.e. a local disk: one folder per state dir in the temp folder.
    tag = hashlib.sha256(ctx.state_dir.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"mmlinks-http-rate-{tag}")


def policy_from_context(ctx: SourceContext, hosts: set[str], **overrides: Any) -> HttpPolicy:
    """An HttpPolicy for ``hosts`` from the source's politeness options; ``overrides`` win.

    The connector's own option table must include ``http_source_options()``.
    """
    rate = ctx.float("rate")
    if rate is not None and rate <= 0:
        raise MmlinksError(f"--source-option rate wants a positive number or none, not {ctx.raw('rate')!r}")
    concurrency = ctx.int("concurrency")
    concurrency = 2 if concurrency is None else concurrency
    if concurrency < 1:
        raise MmlinksError("--source-option concurrency wants at least 1")
    retries = ctx.int("retries")
    retries = 5 if retries is None else retries
    if retries < 0:
        raise MmlinksError("--source-option retries wants 0 or more")
    backoff_max = ctx.float("backoff_max")
    backoff_max = 60.0 if backoff_max is None else backoff_max
    if backoff_max < 0:
        raise MmlinksError("--source-option backoff_max wants 0 or more seconds")
    cache = ctx.str("http_cache")
    if cache is None or cache.strip() == "":
        cache_dir: str | None = ctx.state("http-cache")
    elif cache.strip().lower() in ("off", "false", "none", "no", "0"):
        cache_dir = None
    else:
        cache_dir = cache.strip()
    for host in hosts:
        _parse_allow_entry(host)
    settings: dict[str, Any] = dict(
        allowed_hosts=frozenset(h.lower() for h in hosts),
        rate_per_host=rate,
        max_concurrency_per_host=concurrency,
        max_retries=retries,
        backoff_base=min(1.0, backoff_max),
        backoff_max=backoff_max,
        cache_dir=cache_dir,
        allow_private=ctx.bool("allow_private"),
        state_dir=_rate_dir(ctx),
    )
    if not ctx.bool("polite"):
        settings.update(
            rate_per_host=None, backoff_base=0.01, backoff_max=min(backoff_max, 0.1), clamp_waits=True
        )
    settings.update(overrides)
    return HttpPolicy(**settings)


# --------------------------------------------------------------------------- image-store fetcher


class PoliteFetcher:
    """The image store's ``Fetcher`` over a ``PoliteClient``: allowlisted, rate-limited images.

    Images skip the response cache: the image store keeps them content-addressed already. A
    redirect to an allowed host's ``/removed.png`` returns normally; the store recognises the
    placeholder from ``final_uri``.

    Only failures that belong to the image are permanent (the store records them for later
    builds): 404/410 (``not_found``) and ``too_large``. Everything else is ``transient`` and
    not stored, because it depends on this run's settings (``refused_host``,
    ``private_address``, ``bad_url``, ``too_many_redirects``) or on the moment (401/403, other
    4xx, a 3xx without Location, 5xx, exhausted retries).
    """

    def __init__(self, client: PoliteClient):
        self.client = client

    def fetch(self, uri: str, max_bytes: int):
        from pipelines.image_store import FETCH_FAILED, NOT_FOUND, TOO_LARGE, FetchFailed, FetchResult

        try:
            resp = self.client.get(uri, max_bytes=max_bytes, use_cache=False)
        except HttpError as exc:
            if exc.reason == "too_large":
                raise FetchFailed(TOO_LARGE, exc.detail[:300], status=exc.status) from exc
            raise FetchFailed(
                FETCH_FAILED, f"{exc.reason}: {exc.detail}"[:300], transient=True, status=exc.status
            ) from exc
        if resp.status in (404, 410):
            raise FetchFailed(NOT_FOUND, f"HTTP {resp.status} {_redact(resp.url)}", status=resp.status)
        if not 200 <= resp.status < 300:
            raise FetchFailed(
                FETCH_FAILED, f"HTTP {resp.status} {_redact(resp.url)}", transient=True, status=resp.status
            )
        return FetchResult(resp.body, resp.url)
