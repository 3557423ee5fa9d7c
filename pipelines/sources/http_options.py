"""What every web source offers: the politeness ``--source-option``s and the HttpPolicy they give."""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

from pipelines import fileio
from pipelines.sources.base import SourceContext, SourceOption
from pipelines.web.guard import parse_allow_entry
from pipelines.web.policy import HttpPolicy
from pipelines.web.transport import check_proxy
from schemas.errors import MmlinksError


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
        ("proxy", None, "http(s) proxy URL for every request (HTTP_PROXY & co. are ignored)"),
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
        parse_allow_entry(host)
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
        proxy=check_proxy(ctx.str("proxy")),
    )
    if not ctx.bool("polite"):
        settings.update(
            rate_per_host=None, backoff_base=0.01, backoff_max=min(backoff_max, 0.1), clamp_waits=True
        )
    settings.update(overrides)
    return HttpPolicy(**settings)


def polite_fetcher(ctx: SourceContext, hosts: set[str]):
    """The image store's fetcher of a web source: its politeness options, allowlisted to ``hosts``."""
    from pipelines.image_fetch import PoliteFetcher
    from pipelines.web.client import PoliteClient

    return PoliteFetcher(PoliteClient(policy_from_context(ctx, hosts)))
