"""How the image store gets bytes: the ``Fetcher`` protocol (files and Beam URIs, plain HTTP, a
source's ``PoliteClient``). A ``transient`` ``FetchFailed`` is not recorded, so a later build
retries it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import requests

from features.images import InvalidImage
from pipelines import fileio
from pipelines.web.client import PoliteClient, iter_body
from pipelines.web.deadline import Deadline
from pipelines.web.guard import redact_url
from pipelines.web.policy import HttpError
from pipelines.web.transport import check_proxy, pinned_session

USER_AGENT = "mmlinks/0.1 (+https://github.com/mmlinks)"
TOO_LARGE, FETCH_FAILED, NOT_FOUND = "too_large", "fetch_failed", "not_found"


class FetchFailed(InvalidImage):
    """A fetcher's failure. ``transient`` ones (worth retrying later) are not cached."""

    def __init__(self, reason: str, detail: str = "", *, transient: bool = False, status: int | None = None):
        super().__init__(reason, detail)
        self.transient = transient
        self.status = status


@dataclass(frozen=True)
class FetchResult:
    data: bytes
    final_uri: str  # after redirects


@runtime_checkable
class Fetcher(Protocol):
    def fetch(self, uri: str, max_bytes: int) -> FetchResult:
        """Return the bytes, or raise InvalidImage (FetchFailed) with one of the fetch reasons:
        ``not_found``, ``too_large`` (more than ``max_bytes``), ``fetch_failed``."""
        ...


class FileSystemFetcher:
    """Reads local paths, ``file://`` URIs and anything else Beam FileSystems knows (gs://, s3://)."""

    def fetch(self, uri: str, max_bytes: int) -> FetchResult:
        try:
            data = fileio.read_bytes(uri, limit=max_bytes)
        except fileio.FileTooLarge as exc:
            raise FetchFailed(TOO_LARGE, f"more than {max_bytes} bytes") from exc
        except FileNotFoundError as exc:
            # Cheap to check again and the corpus may be repaired: transient, not cached.
            raise FetchFailed(FETCH_FAILED, f"missing file: {uri}", transient=True) from exc
        except (OSError, ValueError) as exc:  # BeamIOError is an OSError; unknown scheme: ValueError
            raise FetchFailed(FETCH_FAILED, f"{uri}: {exc}"[:300], transient=True) from exc
        return FetchResult(data, uri)

    def stamp(self, uri: str) -> str | None:
        """Size and modification time: a file rewritten in place must be fetched again.

        (Image-host URLs name immutable content and have no stamp; local corpora do get
        regenerated into the same folder.)
        """
        from apache_beam.io.filesystems import FileSystems

        try:
            meta = FileSystems.match([fileio.normalize(uri)])[0].metadata_list
        except (OSError, ValueError):
            return None
        if not meta:
            return None
        return f"{meta[0].size_in_bytes}:{meta[0].last_updated_in_seconds}"


class HttpFetcher:
    """GET with ``requests``: streamed, byte-limited, redirects followed and the final URL kept.

    ``timeout`` is (connect, read) seconds per socket operation; ``max_seconds`` bounds a whole
    fetch, redirects included (``pipelines.web.deadline``). The session is created lazily and not
    pickled; a session passed in is used as it is (only its body reads are bounded, its addresses not
    checked). Unless ``allow_private``, private addresses are refused on every hop (``fetch_failed``,
    transient: it depends on this setting) and connections are pinned to the addresses checked, as
    the polite client's (``pipelines.web.transport``). There is no allowlist: a source whose URLs
    come from the web gives the store a ``PoliteFetcher``.
    """

    def __init__(
        self,
        *,
        timeout: float | tuple[float, float] = (10.0, 30.0),
        max_seconds: float = 120.0,
        user_agent: str = USER_AGENT,
        max_redirects: int = 10,
        chunk_size: int = 64 * 1024,
        session: requests.Session | None = None,
        allow_private: bool = False,
        proxy: str | None = None,
    ):
        self.timeout = timeout
        self.max_seconds = max_seconds
        self.user_agent = user_agent
        self.max_redirects = max_redirects
        self.chunk_size = chunk_size
        self._session = session
        self.allow_private = allow_private
        self.proxy = check_proxy(proxy)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_session"] = None
        return state

    @property
    def session(self) -> requests.Session:
        if self._session is None:
            # Pinned to the checked addresses; a deadline reaches the socket before the headers;
            # no proxy from the environment (only ``proxy``).
            s = pinned_session(public_only=not self.allow_private, proxy=self.proxy)
            s.headers["User-Agent"] = self.user_agent
            s.max_redirects = self.max_redirects
            self._session = s
        return self._session

    def fetch(self, uri: str, max_bytes: int) -> FetchResult:
        with Deadline(self.max_seconds or None) as deadline:  # 0: no deadline
            try:
                return self._fetch(uri, max_bytes, deadline)
            except (FetchFailed, requests.RequestException):
                if deadline.expired:  # cut off: what the cut read raised is only a symptom
                    raise self._too_slow() from None
                raise

    def _too_slow(self) -> FetchFailed:
        return FetchFailed(FETCH_FAILED, f"download took over {self.max_seconds:g} s", transient=True)

    def _fetch(self, uri: str, max_bytes: int, deadline: Deadline) -> FetchResult:
        try:
            resp = self.session.get(uri, stream=True, timeout=self.timeout, allow_redirects=True)
        except requests.Timeout as exc:
            raise FetchFailed(FETCH_FAILED, f"timeout: {exc}"[:300], transient=True) from exc
        except requests.TooManyRedirects as exc:
            raise FetchFailed(FETCH_FAILED, f"too many redirects: {uri}") from exc
        except requests.ConnectionError as exc:
            raise FetchFailed(FETCH_FAILED, f"connection error: {exc}"[:300], transient=True) from exc
        except requests.RequestException as exc:  # invalid URL, unsupported scheme, ...
            raise FetchFailed(FETCH_FAILED, f"{type(exc).__name__}: {exc}"[:300]) from exc
        except HttpError as exc:  # the connection's address check (private_address)
            raise FetchFailed(FETCH_FAILED, f"{exc.reason}: {exc.detail}"[:300], transient=True) from exc
        with resp:
            if deadline.expired:  # headers cut short parse as complete ones
                raise self._too_slow()
            final, code = resp.url, resp.status_code
            if code in (404, 410):
                raise FetchFailed(NOT_FOUND, f"HTTP {code} {final}", status=code)
            if not 200 <= code < 300:
                transient = code >= 500 or code in (408, 429)
                raise FetchFailed(FETCH_FAILED, f"HTTP {code} {final}", transient=transient, status=code)
            length = resp.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > max_bytes:
                raise FetchFailed(TOO_LARGE, f"Content-Length {length} > {max_bytes} bytes", status=code)
            buf = bytearray()
            try:
                for chunk in iter_body(resp, self.chunk_size):
                    buf += chunk
                    if len(buf) > max_bytes:
                        raise FetchFailed(TOO_LARGE, f"more than {max_bytes} bytes", status=code)
                    if deadline.expired:
                        raise self._too_slow()
            except requests.RequestException as exc:  # read timeout, broken chunked encoding
                raise FetchFailed(FETCH_FAILED, f"while reading: {exc}"[:300], transient=True) from exc
            if deadline.expired:  # a body without a Content-Length cut short ends like a whole one
                raise self._too_slow()
        return FetchResult(bytes(buf), final)


class PoliteFetcher:
    """The image store's ``Fetcher`` over a ``PoliteClient``: allowlisted, rate-limited images.

    Images skip the response cache (the store keeps them content-addressed already); a redirect to
    an allowed host's ``/removed.png`` returns normally and the store recognises the placeholder from
    ``final_uri``. Only failures that belong to the image are permanent (recorded by the store):
    404/410 (``not_found``) and ``too_large``. Everything else is ``transient``, because it depends on
    this run's settings (``refused_host``, ``private_address``, ``bad_url``, ...) or on the moment.
    """

    def __init__(self, client: PoliteClient):
        self.client = client

    def fetch(self, uri: str, max_bytes: int):
        try:
            resp = self.client.get(uri, max_bytes=max_bytes, use_cache=False)
        except HttpError as exc:
            if exc.reason == "too_large":
                raise FetchFailed(TOO_LARGE, exc.detail[:300], status=exc.status) from exc
            raise FetchFailed(
                FETCH_FAILED, f"{exc.reason}: {exc.detail}"[:300], transient=True, status=exc.status
            ) from exc
        if resp.status in (404, 410):
            raise FetchFailed(NOT_FOUND, f"HTTP {resp.status} {redact_url(resp.url)}", status=resp.status)
        if not 200 <= resp.status < 300:
            raise FetchFailed(
                FETCH_FAILED, f"HTTP {resp.status} {redact_url(resp.url)}", transient=True, status=resp.status
            )
        return FetchResult(resp.body, resp.url)


def default_fetcher(uri: str) -> Fetcher:
    """HttpFetcher for http(s) URIs, FileSystemFetcher for everything else."""
    if urlsplit(uri).scheme.lower() in ("http", "https"):
        return HttpFetcher()
    return FileSystemFetcher()
