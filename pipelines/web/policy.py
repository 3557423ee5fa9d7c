"""What a polite request may do (:class:`HttpPolicy`), what comes back (:class:`HttpResponse`), and
how it fails (:class:`HttpError`, whose ``reason`` is a dead-letter reason).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from schemas.errors import MmlinksError

DEFAULT_USER_AGENT = "mmlinks/0.1 (research crawler; +https://github.com/mmlinks/mmlinks)"
# The longest pause or block of a host a server's Retry-After or rate-limit reset can cause,
# and the longest a block read back from a gate file is honoured (seconds from now).
MAX_BLOCK_S = 3600.0


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
    max_seconds: float | None = 300.0  # bound on one whole get: retries, redirects, waits, bodies
    # http(s) proxy for every request; never taken from HTTP_PROXY & co. Behind it the proxy
    # resolves names, so only the checks before a request apply (``pipelines.web.transport``).
    proxy: str | None = None


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
