"""The requests transport every web request goes through: each new connection resolves its host
once, has the guard check that answer, and connects to exactly the addresses checked.

Why: a second lookup by urllib3 could rebind (a public address for the check, 127.0.0.1 for the
connect). Only the TCP connect is pinned, so Host, SNI and certificate checks use the name;
redirect hops and retries are checked as they connect. Connections also register their sockets
with the request's deadline. Why no environment proxy (``trust_env`` off): a proxy connection is
not pinned; an explicit ``HttpPolicy.proxy`` keeps only the per-hop checks."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any, ClassVar
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.poolmanager import PoolManager, ProxyManager
from urllib3.util.connection import allowed_gai_family
from urllib3.util.timeout import _DEFAULT_TIMEOUT

from pipelines.web.deadline import Watched
from pipelines.web.guard import AddrInfo, resolve_checked
from schemas.errors import MmlinksError


class Pinned:
    """A urllib3 connection that resolves its host once, has the guard check the answer
    (``public_only``), and connects to those addresses in order, never resolving again.
    Mixed in before HTTPConnection or HTTPSConnection; errors as urllib3's own ``_new_conn``
    raises them, plus the guard's HttpError ``private_address``, which requests passes on."""

    public_only = False

    def _new_conn(self) -> socket.socket:
        if self.proxy is not None:  # type: ignore[attr-defined]  # the proxy resolves the target
            return super()._new_conn()  # type: ignore[misc]
        host: str = self._dns_host  # type: ignore[attr-defined]
        port: int = self.port  # type: ignore[attr-defined]
        try:
            infos = resolve_checked(
                host.strip("[]"), port, public_only=self.public_only, family=allowed_gai_family()
            )
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc  # type: ignore[attr-defined,arg-type]
        try:
            sock = self._connect_first(infos)
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                self,
                f"Connection to {self.host} timed out. (connect timeout={self.timeout})",  # type: ignore[attr-defined]
            ) from exc
        except OSError as exc:
            raise NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc  # type: ignore[arg-type]
        sys.audit("http.client.connect", self, self.host, port)  # type: ignore[attr-defined]
        return sock

    def _connect_first(self, infos: list[AddrInfo]) -> socket.socket:
        """A socket connected to the first of ``infos`` that answers (as
        ``urllib3.util.connection.create_connection`` does, without its lookup)."""
        last: OSError | None = None
        for family, kind, proto, _canon, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                for option in self.socket_options or ():  # type: ignore[attr-defined]
                    sock.setsockopt(*option)
                if self.timeout is not _DEFAULT_TIMEOUT:  # type: ignore[attr-defined]
                    sock.settimeout(self.timeout)  # type: ignore[attr-defined]
                if self.source_address:  # type: ignore[attr-defined]
                    sock.bind(self.source_address)  # type: ignore[attr-defined]
                sock.connect(address)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise last if last is not None else OSError("getaddrinfo returned no address")


class _HTTPConnection(Watched, Pinned, HTTPConnection):
    pass


class _HTTPSConnection(Watched, Pinned, HTTPSConnection):
    pass


class _PublicHTTPConnection(_HTTPConnection):
    public_only = True


class _PublicHTTPSConnection(_HTTPSConnection):
    public_only = True


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class _PublicHTTPPool(HTTPConnectionPool):
    ConnectionCls = _PublicHTTPConnection


class _PublicHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _PublicHTTPSConnection


class PinnedAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` whose connections connect to exactly the addresses they resolved
    and checked (``public_only``: refuse loopback/private/link-local/reserved answers with
    HttpError ``private_address``), and register their sockets with the thread's active
    :class:`pipelines.web.deadline.Deadline`. Mount it for ``http://`` and ``https://``."""

    __attrs__: ClassVar[list[str]] = [*HTTPAdapter.__attrs__, "public_only"]  # what pickling an adapter keeps

    def __init__(self, *, public_only: bool, **kwargs: Any):
        self.public_only = public_only
        super().__init__(**kwargs)

    def _pools(self) -> dict[str, type[HTTPConnectionPool]]:
        if self.public_only:
            return {"http": _PublicHTTPPool, "https": _PublicHTTPSPool}
        return {"http": _HTTPPool, "https": _HTTPSPool}

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self._pools()

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> PoolManager:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if type(manager) is ProxyManager:  # not SOCKS: its own connection classes
            manager.pool_classes_by_scheme = self._pools()
        return manager


def check_proxy(proxy: str | None) -> str | None:
    """``proxy`` as given if it is an http(s) proxy URL (or None/empty: no proxy); MmlinksError
    otherwise, never echoing the URL (it may carry a password)."""
    if not proxy:
        return None
    try:
        parts = urlsplit(proxy)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018  # a bad port raises here
    except ValueError:
        ok = False
    if not ok:
        raise MmlinksError("a proxy must be an http:// or https:// URL with a host (e.g. http://proxy:3128)")
    return proxy


def pinned_session(*, public_only: bool, proxy: str | None = None) -> requests.Session:
    """A ``requests.Session`` whose connections are pinned to the addresses the guard checked
    (:class:`PinnedAdapter`) and which reads nothing from the environment but a CA bundle.

    ``trust_env`` is off: with it, ``HTTP_PROXY`` pointing anywhere sends every request through
    an unpinned proxy connection and DNS rebinding works again (issue #46), and ``.netrc``
    would add credentials nobody asked for. ``proxy`` (http or https URL) is used for both
    schemes when given. ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` are still honoured (they
    only narrow which certificates are trusted).
    """
    s = requests.Session()
    s.trust_env = False
    ca_bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if ca_bundle:
        s.verify = ca_bundle
    proxy = check_proxy(proxy)
    if proxy:
        s.proxies = {"http": proxy, "https": proxy}
    adapter = PinnedAdapter(public_only=public_only)
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    return s
