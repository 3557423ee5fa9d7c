"""The SSRF guard: which hosts a request may reach, and what of a URL may be logged.

Only allowlisted hosts; unless a policy allows private addresses, one that is or resolves to a
non-public address (also embedded in IPv6) is refused. Credential headers never cross origins;
logged URLs lose user info, query and fragment."""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Any
from urllib.parse import urlsplit

from pipelines.web.policy import HttpError
from schemas.errors import MmlinksError

# Never sent to another origin, never part of a cache key or a cache file: they identify a user.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def split_host(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL; HttpError bad_url otherwise."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:  # bad port, bad IPv6 literal
        raise HttpError("bad_url", f"{redact_url(url)}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise HttpError("bad_url", f"only http and https, not {scheme or 'no scheme'}: {redact_url(url)}")
    if not host:
        raise HttpError("bad_url", f"no host: {redact_url(url)}")
    return scheme, host.lower().rstrip("."), port or _default_port(scheme)


def parse_allow_entry(entry: str) -> tuple[str, int | None]:
    if "@" in entry:  # never echoed: the part before "@" may be a password or a token
        raise MmlinksError(
            "an allowlist entry carries user info (user:password@host); credentials belong in "
            "the environment, not in a host or base URL"
        )
    entry = entry.strip().lower()
    if entry.startswith("*."):
        return entry, None
    try:
        parts = urlsplit("//" + entry)
        host, port = parts.hostname, parts.port
    except ValueError:
        raise MmlinksError(f"bad allowlist entry {entry!r} (want host, host:port or *.domain)") from None
    if not host:
        raise MmlinksError(f"bad allowlist entry {entry!r} (want host, host:port or *.domain)")
    return host.rstrip("."), port


def host_allowed(allowed_hosts: frozenset[str] | set[str], host: str, port: int) -> bool:
    """Whether ``host:port`` is on the allowlist (entries: ``host``, ``host:port``, ``*.domain``)."""
    host = host.lower().rstrip(".")
    for entry in allowed_hosts:
        name, want_port = parse_allow_entry(entry)
        if name.startswith("*."):
            if host.endswith(name[1:]) and len(host) > len(name) - 1:
                return True
        elif name == host and (want_port is None or want_port == port):
            return True
    return False


# IPv6 ranges whose addresses carry an IPv4 address a router or a translator will deliver to:
# the address check must judge that IPv4 address, or ``2002:7f00:1::1`` (6to4 for 127.0.0.1)
# reaches loopback past a check that only sees a "global" IPv6 address.
# (6to4, RFC 3056, and Teredo, RFC 4380, are ``ipaddress``'s own ``sixtofour`` and ``teredo``.)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052 well-known prefix: last 32 bits
# RFC 8215 local-use NAT64: the operator picks the prefix length (/48 to /96), so where the IPv4
# address sits is unknown; it is never a public destination: refused whole.
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # RFC 4291 (deprecated): ::a.b.c.d


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address delivers to: IPv4-mapped (``::ffff:a.b.c.d``),
    IPv4-compatible (``::a.b.c.d``), 6to4 (``2002:AABB:CCDD::/48``), Teredo (the client, XOR-ed)
    or NAT64 (``64:ff9b::a.b.c.d``); None for any other address."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):  # not :: or ::1 (judged as IPv6)
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _address_refused(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # an IPv4 address in IPv6 clothing: judged as that address
            ip = ip.ipv4_mapped
        elif ip in _NAT64_LOCAL:
            return True
        else:  # the IPv4 address it carries, and (below) the IPv6 address itself
            inner = embedded_ipv4(ip)
            if inner is not None and _address_refused(inner):
                return True
    return (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
        or not ip.is_global
    )


AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]  # a getaddrinfo row


def _refuse_non_public(host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    if _address_refused(ip):
        raise HttpError("private_address", f"{host} resolves to non-public address {ip}")


def check_public_host(host: str, port: int) -> None:
    """Raise HttpError private_address when ``host`` is or resolves to a non-public address.

    A look-before-you-leap check (the polite client runs it before spending a rate slot);
    the check that counts is the connection's own (:func:`resolve_checked`), on the answer it
    connects to. A resolution failure is an OSError (socket.gaierror), which the caller treats
    as a connection error (transient).
    """
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        _refuse_non_public(host, literal)
    else:
        resolve_checked(host, port, public_only=True)


def resolve_checked(
    host: str, port: int, *, public_only: bool, family: int = socket.AF_UNSPEC
) -> list[AddrInfo]:
    """``host``'s addresses (getaddrinfo's rows for a TCP stream), resolved once; with
    ``public_only``, HttpError private_address if any of them is non-public.

    A connection must connect to these rows and nothing else (``pipelines.web.transport``):
    resolving again to connect would let a DNS answer that changed meanwhile (rebinding)
    reach an address this check never saw. Every row is checked, not only the first, because
    a connection falls back to the next row when one does not answer.
    """
    infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    if public_only:
        for info in infos:
            _refuse_non_public(host, ipaddress.ip_address(str(info[4][0]).split("%")[0]))
    return infos


def scrub_message(message: str) -> str:
    """An exception message without URL queries (requests quotes the URL, query and all)."""
    return re.sub(r"\?[^\s'\")]*", "?...", message)


def redact_url(url: str) -> str:
    """The URL without user info, query or fragment, for logs and messages (they may hold keys)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


redact_url = redact_url
