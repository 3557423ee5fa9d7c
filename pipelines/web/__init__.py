"""The polite HTTP client shared by every web connector (imgur, Reddit API, MediaWiki).

Why: crawling other people's servers must not hurt them or us (docs/sources.md, "The polite HTTP
client"): allowlist per redirect hop with pinned addresses (``transport``), no environment proxy,
per-host spacing across processes (``rate_gate``), full-jitter retries (``retries``), one
deadline per ``get`` (``deadline``), a credential-free disk cache. No block reaches past
``MAX_BLOCK_S`` (one hour) from now, so a server naming next year cannot shut a host out of later
builds. Headers are never logged and logged URLs lose their query; this package imports no source."""

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
