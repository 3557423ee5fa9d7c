"""The polite GET: allowlist and address checks per hop, rate gate, retries, capped reads, cache.

See the package docstring (``pipelines.web``) for the rules every request follows.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urljoin

import requests

from pipelines import fileio
from pipelines.web.cache import CACHEABLE_STATUSES, cache_key, decode_entry, encode_entry
from pipelines.web.deadline import Deadline
from pipelines.web.guard import (
    CREDENTIAL_HEADERS,
    check_public_host,
    host_allowed,
    parse_allow_entry,
    redact_url,
    scrub_message,
    split_host,
)
from pipelines.web.policy import MAX_BLOCK_S, HttpError, HttpPolicy, HttpResponse
from pipelines.web.rate_gate import RATE_MARGIN, HostGate, host_gate, host_semaphore
from pipelines.web.retries import (
    TransientFailure,
    backoff_delay,
    parse_retry_after,
    rate_limit_reset,
    should_retry,
)
from pipelines.web.transport import check_proxy, pinned_session
from schemas.errors import MmlinksError

log = logging.getLogger(__name__)

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024


def iter_body(resp: requests.Response, chunk_size: int) -> Iterator[bytes]:
    """A streamed response's decoded body as it arrives: each chunk is what one read of the
    socket gave (at most ``chunk_size`` bytes).

    ``resp.iter_content(n)`` blocks until ``n`` bytes have arrived, so a server that sends its
    headers and then one byte every 0.2 s keeps one 64 KiB chunk coming for 3.6 hours and a
    deadline checked between chunks never fires (``tests/faults/test_web_faults.py``, the
    slowloris scenario). ``read1`` returns after one read of the socket. urllib3's errors
    become the requests exceptions ``iter_content`` raises, which the callers handle.
    """
    from urllib3.exceptions import DecodeError, ProtocolError, ReadTimeoutError, SSLError

    raw = resp.raw
    try:
        while chunk := raw.read1(chunk_size, decode_content=True):
            yield chunk
    except ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from exc
    except DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(exc) from exc
    except ReadTimeoutError as exc:
        raise requests.exceptions.ConnectionError(exc) from exc
    except SSLError as exc:
        raise requests.exceptions.SSLError(exc) from exc


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
            parse_allow_entry(entry)  # a bad entry fails here, not on the first request
        check_proxy(policy.proxy)
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
            # Connects to exactly the addresses the guard checked (no second DNS lookup to
            # rebind), lets a request's deadline reach its socket before the headers, and takes
            # no proxy from the environment (only ``policy.proxy``).
            s = pinned_session(public_only=not self.policy.allow_private, proxy=self.policy.proxy)
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
            raise HttpError("bad_url", f"{redact_url(str(url))}: {type(exc).__name__}") from None
        _scheme, host, port = split_host(full_url)
        self._check_host(host, port)
        cache_uri = None
        if use_cache and self.policy.cache_dir:
            key = cache_key(full_url, headers)
            cache_uri = fileio.join(self.policy.cache_dir, key[:2], f"{key}.http")
            hit = self._cache_read(cache_uri, limit)
            if hit is not None:
                return hit
        # One deadline for the whole call: every redirect hop, retry and backoff wait inside it.
        with Deadline(self.policy.max_seconds or None) as deadline:  # 0 or None: no deadline
            resp = self._follow(full_url, dict(headers or {}), limit, deadline)
        if cache_uri is not None and resp.status in CACHEABLE_STATUSES:
            try:
                fileio.write_bytes_atomic(cache_uri, encode_entry(resp, self._now()))
            except OSError as exc:  # a full disk or a bucket hiccup must not fail the request
                log.warning("http cache write failed for %s: %s", redact_url(full_url), exc)
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
        decoded = decode_entry(data)
        if decoded is None:
            log.info("ignoring a corrupt http cache entry %s", uri)
            return None
        resp, stored_at = decoded
        ttl = self.policy.cache_ttl
        if ttl is not None and self._now() - stored_at > ttl:
            return None
        try:
            _s, host, port = split_host(resp.url)
            self._check_host(host, port)  # the allowlist may have narrowed since
        except HttpError:
            return None
        if len(resp.body) > limit:
            raise HttpError(
                "too_large", f"cached body of {len(resp.body)} bytes > {limit}", status=resp.status
            )
        return resp

    def _follow(self, url: str, headers: dict[str, str], limit: int, deadline: Deadline) -> HttpResponse:
        """Follow redirects by hand, checking every hop against the allowlist."""
        first_scheme, *first_origin = split_host(url)
        for _hop in range(self.policy.max_redirects + 1):
            scheme, host, port = split_host(url)
            self._check_host(host, port)
            # Credentials are for the origin they were meant for, and never go out unencrypted.
            if [host, port] != first_origin or (first_scheme == "https" and scheme == "http"):
                headers = {k: v for k, v in headers.items() if k.lower() not in CREDENTIAL_HEADERS}
            resp = self._get_with_retries(url, host, port, headers, limit, deadline)
            location = resp.headers.get("location")
            if resp.status in REDIRECT_STATUSES and location:
                url = urljoin(url, location)
                continue
            return resp
        raise HttpError("too_many_redirects", f"more than {self.policy.max_redirects}: {redact_url(url)}")

    def _get_with_retries(
        self, url: str, host: str, port: int, headers: dict[str, str], limit: int, deadline: Deadline
    ) -> HttpResponse:
        p = self.policy
        host_key = f"{host}:{port}"
        gate = host_gate(p.state_dir, host_key)
        last = "no attempt"
        last_status: int | None = None
        for attempt in range(p.max_retries + 1):
            try:
                resp = self._attempt(url, host, port, host_key, gate, headers, limit, deadline)
            except TransientFailure as exc:
                last, last_status = exc.detail, None
                wait = backoff_delay(attempt, p.backoff_base, p.backoff_max, self._jitter)
            else:
                self._note_rate_limit(gate, resp.headers, host_key)
                if not should_retry(resp):
                    return resp
                last, last_status = f"HTTP {resp.status}", resp.status
                demanded = parse_retry_after(resp.headers.get("retry-after"), self._now())
                if demanded is not None:
                    if demanded > p.backoff_max and not p.clamp_waits:
                        if resp.status == 429:  # "too many requests" is about the host: stop asking
                            gate.block(self._now() + min(demanded, MAX_BLOCK_S))
                        raise HttpError(
                            "retries_exhausted",
                            f"{redact_url(url)}: {last} with Retry-After {demanded:g} s"
                            f" > {p.backoff_max:g} s",
                            transient=True,
                            status=last_status,
                        )
                    wait = min(demanded, p.backoff_max, MAX_BLOCK_S)
                    gate.pause(self._now() + wait)  # the whole host, for every worker
                else:
                    wait = backoff_delay(attempt, p.backoff_base, p.backoff_max, self._jitter)
            if attempt == p.max_retries:
                break
            if deadline.expired or wait >= deadline.remaining:  # the call's max_seconds is spent
                raise HttpError(
                    "retries_exhausted",
                    f"{redact_url(url)}: {last}; no time left for a retry in the request's"
                    f" {p.max_seconds:g} s after {attempt + 1} attempts",
                    transient=True,
                    status=last_status,
                )
            log.info(
                "retry %d/%d of %s in %.2f s (%s)", attempt + 1, p.max_retries, redact_url(url), wait, last
            )
            self._sleep(wait)
        raise HttpError(
            "retries_exhausted",
            f"{redact_url(url)}: {last} after {p.max_retries + 1} attempts",
            transient=True,
            status=last_status,
        )

    def _note_rate_limit(self, gate: HostGate, headers: dict[str, str], host_key: str) -> None:
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
        gate: HostGate,
        headers: dict[str, str],
        limit: int,
        deadline: Deadline,
    ) -> HttpResponse:
        """One request: address check, concurrency slot, rate slot, streamed capped read.

        The address check here refuses a private host before a rate slot is spent; the one
        that counts is the connection's own, on the answer it connects to
        (``pipelines.web.transport``): it raises the same ``private_address`` HttpError.
        """
        p = self.policy
        if not p.allow_private:
            try:
                check_public_host(host, port)
            except OSError as exc:
                raise TransientFailure(f"cannot resolve {host}: {exc}") from None
        sem = host_semaphore(p.state_dir, host_key, p.max_concurrency_per_host)
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
                return self._send(url, headers, limit, deadline)
            except (
                requests.Timeout,
                requests.ConnectionError,
                requests.exceptions.ChunkedEncodingError,
            ) as exc:
                raise TransientFailure(scrub_message(f"{type(exc).__name__}: {exc}")[:300]) from None
            except requests.exceptions.RequestException as exc:  # invalid URL/header, ...
                raise HttpError("bad_url", f"{redact_url(url)}: {type(exc).__name__}") from None

    def _send(self, url: str, headers: dict[str, str], limit: int, deadline: Deadline) -> HttpResponse:
        """One HTTP request (connect, headers, body) under the ``get``'s deadline.

        The deadline is per ``get``, not per attempt: retries, redirect hops and the waits
        between them all spend the same ``max_seconds`` (before, each attempt of each hop had its
        own, so one ``get`` could take (max_redirects + 1) * (max_retries + 1) * max_seconds plus
        the backoff: 3 hours with the defaults). A request cut off by it fails with the same
        transient failure wherever it was cut, and whatever it returned or raised is ignored
        (see ``pipelines.web.deadline``); ``_get_with_retries`` then retries no more.
        """
        _check(deadline)  # spent already (a rate-gate wait, the previous hop)
        try:
            return self._exchange(url, headers, limit, deadline)
        except requests.exceptions.RequestException:
            _check(deadline)  # the deadline cut the request: its error is a symptom
            raise

    def _exchange(self, url: str, headers: dict[str, str], limit: int, deadline: Deadline) -> HttpResponse:
        resp = self.session.get(
            url, headers=headers, timeout=self.policy.timeout, stream=True, allow_redirects=False
        )
        with resp:
            _check(deadline)  # headers cut short parse as complete ones
            status = resp.status_code
            out_headers = {k.lower(): v for k, v in resp.headers.items()}
            if status in REDIRECT_STATUSES and out_headers.get("location"):
                return HttpResponse(url, status, out_headers, b"")
            length = out_headers.get("content-length", "")
            if length.isdigit() and int(length) > limit:
                raise HttpError(
                    "too_large", f"Content-Length {length} > {limit} bytes: {redact_url(url)}", status=status
                )
            buf = bytearray()
            for chunk in iter_body(resp, _CHUNK):
                buf += chunk
                if len(buf) > limit:
                    raise HttpError("too_large", f"more than {limit} bytes: {redact_url(url)}", status=status)
                _check(deadline)
            _check(deadline)  # a body without a Content-Length cut short ends like a whole one
        return HttpResponse(url, status, out_headers, bytes(buf))


def _check(deadline: Deadline) -> None:
    """Fail the request if its deadline has cut it off, whatever it returned."""
    if deadline.expired:
        raise TransientFailure(f"download took over {deadline.max_seconds:g} s")
