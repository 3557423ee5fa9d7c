"""When to retry and how long to wait: full-jitter backoff, ``Retry-After``, rate-limit headers.

Why not urllib3's ``Retry`` or tenacity: urllib3 retries inside ``urlopen``, so a body reset
mid-read is not retried and an over-long ``Retry-After`` is slept out instead of failing as
transient (tests/faults/test_web_faults.py); between attempts the client must take a rate slot,
honour rate-limit headers, give each attempt a deadline and sleep on an injected clock. tenacity
would be a dependency for no behaviour. What is left is arithmetic and header parsing."""

from __future__ import annotations

import email.utils
import random
from collections.abc import Callable
from datetime import UTC

from pipelines.web.policy import HttpResponse

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


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


class TransientFailure(Exception):
    """Internal: a failed attempt worth retrying (timeout, connection error, DNS failure)."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def should_retry(resp: HttpResponse) -> bool:
    if resp.status in RETRY_STATUSES:
        return True
    # imgur answers 403 with "Imgur is over capacity!" when it sheds load; it is not a ban.
    return resp.status == 403 and b"over capacity" in resp.body[:4096].lower()
