"""The on-disk response cache format: keys that never include credentials, whole-entry checks.

Why not requests-cache or CacheControl: this cache lives on any Beam FileSystems URI, keeps 200,
404 and 410 whatever ``Cache-Control`` says (so a rerun does not ask again), and is keyed by the
request before redirects are followed by hand; the libraries do none of these. A torn or foreign
file is a miss."""

from __future__ import annotations

import hashlib
import json

from pipelines.web.guard import CREDENTIAL_HEADERS
from pipelines.web.policy import HttpResponse

CACHEABLE_STATUSES = frozenset({200, 404, 410})
_NOT_STORED_RESPONSE_HEADERS = frozenset({"set-cookie", "set-cookie2"})
_CACHE_MAGIC = b"mmlinks-http-cache/1\n"


def cache_key(url: str, headers: dict[str, str] | None) -> str:
    """sha256 over the method, the full request URL and the non-credential request headers."""
    kept = sorted((k.lower(), v) for k, v in (headers or {}).items() if k.lower() not in CREDENTIAL_HEADERS)
    return hashlib.sha256(json.dumps(["GET", url, kept]).encode()).hexdigest()


def encode_entry(resp: HttpResponse, stored_at: float) -> bytes:
    meta = {
        "url": resp.url,
        "status": resp.status,
        "headers": {k: v for k, v in resp.headers.items() if k not in _NOT_STORED_RESPONSE_HEADERS},
        "stored_at": stored_at,
        "length": len(resp.body),
    }
    return _CACHE_MAGIC + json.dumps(meta, sort_keys=True).encode() + b"\n" + resp.body


def decode_entry(data: bytes) -> tuple[HttpResponse, float] | None:
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
