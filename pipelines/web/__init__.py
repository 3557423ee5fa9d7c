"""The polite HTTP client shared by every web connector (imgur, Reddit API, MediaWiki).

Crawling other people's servers for a dataset must not hurt them or us, so every request goes
through the same rules:

- **Allowlist.** Only the hosts a source needs (``host`` = any port, ``host:port`` = that port,
  ``*.example.com`` = any subdomain). Redirects are followed by hand and every hop is checked, so
  a redirect to another host is refused like a direct request. Unless ``allow_private``, a host
  that resolves to a loopback/private/link-local/reserved/multicast address is refused too (a
  crawled URL must not reach into our own network). Each connection resolves its host once, has
  that answer checked and connects to exactly those addresses (``transport``), so a DNS answer
  that changes after the check (rebinding) never reaches a refused address; Host header, SNI
  and the certificate check stay on the name. No proxy is taken from the environment
  (``HTTP_PROXY`` & co. are ignored: through a proxy the pinning does not apply); ``proxy``
  names one explicitly, and behind it only the allowlist and the check before each request
  apply (the proxy resolves the target itself).
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
- **Limits.** Bodies are streamed and capped at ``max_bytes`` (``too_large``); a whole request
  (connect, headers, body) is bounded by ``max_seconds``, and so is one whole ``get``: its retries,
  redirect hops and the waits between them share that one deadline.
- **Cache.** 200 and 404/410 responses are kept on disk (any Beam FileSystems URI) keyed by the
  request, never including credentials, so a rerun of a crawl does not ask again.

Request headers are never logged (they may carry credentials) and logged URLs lose their query.


Modules, one job each: ``policy`` (HttpPolicy/HttpResponse/HttpError), ``guard`` (allowlist,
address check, URL redaction), ``rate_gate`` (cross-process per-host spacing), ``retries``
(backoff, Retry-After, rate-limit headers), ``cache`` (response cache format), ``deadline``
(cutting off a request at ``max_seconds``), ``transport`` (the requests adapter: connections
pinned to the checked addresses, watched by the deadline), ``client`` (PoliteClient). Source options live in
``pipelines.sources.http_options`` and the image-store adapter in
``pipelines.image_fetch.PoliteFetcher``: this package never imports a source.
"""

from pipelines.web.client import PoliteClient
from pipelines.web.guard import check_public_host, host_allowed, redact_url
from pipelines.web.policy import MAX_BLOCK_S, HttpError, HttpPolicy, HttpResponse
from pipelines.web.rate_gate import RATE_MARGIN
from pipelines.web.retries import backoff_delay, parse_retry_after, rate_limit_reset

__all__ = [
    "MAX_BLOCK_S",
    "RATE_MARGIN",
    "HttpError",
    "HttpPolicy",
    "HttpResponse",
    "PoliteClient",
    "backoff_delay",
    "check_public_host",
    "host_allowed",
    "parse_retry_after",
    "rate_limit_reset",
    "redact_url",
]
