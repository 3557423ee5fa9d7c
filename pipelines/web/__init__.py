"""The polite HTTP client shared by every web connector (imgur, Reddit API, MediaWiki).

Crawling other people's servers for a dataset must not hurt them or us, so every request goes
through the same rules (docs/sources.md, "The polite HTTP client"): an allowlist checked on every
redirect hop, with private addresses refused and each connection pinned to the addresses checked
(``transport``); no proxy from the environment (through a proxy the pinning does not apply);
per-host spacing shared across processes through ``flock``-ed files (``rate_gate``: Beam's
DirectRunner runs a worker process per core) and a per-process concurrency cap; retries with
full-jitter backoff (``retries``), where a server's demand longer than ``backoff_max`` fails the
item at once as transient, retried by a later crawl rather than by a sleeping worker; capped
bodies and one deadline per ``get`` shared by its retries and hops (``deadline``); a disk cache of
200 and 404/410 responses keyed without credentials. No pause or block a server asks for reaches
further than ``MAX_BLOCK_S`` (one hour) from now: blocks persist in the gate files across builds,
and a server (or a clock) naming next year must not shut a host out of every later build.
Request headers are never logged (they may carry credentials) and logged URLs lose their query.
Source options live in ``pipelines.sources.http_options`` and the image-store adapter in
``pipelines.image_fetch``: this package never imports a source.
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
