"""The SSRF guard on IPv6 addresses that carry an IPv4 address (issue #46): a router or a
translator delivers them to that IPv4 address, so a loopback/private/link-local one inside must be
refused like the bare address. Before the fix the 6to4 address ``2002:7f00:1::1`` (127.0.0.1)
passed as a global IPv6 address.

Property: every embedding (IPv4-mapped, IPv4-compatible, 6to4, Teredo, NAT64 well-known and
local-use) of every non-public IPv4 address, with arbitrary bits wherever the form leaves some
free, is refused with ``private_address``, as a literal host and as a resolver's answer."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.web import HttpError, check_public_host
from pipelines.web.guard import embedded_ipv4, resolve_checked

NON_PUBLIC_V4 = [
    ipaddress.IPv4Network(n)
    for n in (
        "127.0.0.0/8",  # loopback
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",  # private
        "169.254.0.0/16",  # link-local (cloud metadata)
        "100.64.0.0/10",  # shared address space (carrier NAT)
        "0.0.0.0/8",
        "198.18.0.0/15",
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved
    )
]
PUBLIC_V4 = ipaddress.IPv4Address("93.184.216.34")

U16, U32, U64 = (st.integers(0, 2**b - 1) for b in (16, 32, 64))


@st.composite
def non_public_v4(draw) -> ipaddress.IPv4Address:
    net = draw(st.sampled_from(NON_PUBLIC_V4))
    return net[draw(st.integers(0, net.num_addresses - 1))]


def mapped(v4: int, draw) -> int:  # ::ffff:a.b.c.d
    return 0xFFFF << 32 | v4


def compatible(v4: int, draw) -> int:  # ::a.b.c.d
    return v4


def six_to_four(v4: int, draw) -> int:  # 2002:AABB:CCDD:subnet:interface id
    return 0x2002 << 112 | v4 << 80 | draw(U16) << 64 | draw(U64)


def teredo(v4: int, draw) -> int:  # 2001:0:server:flags:~port:~client
    server, flags, port = draw(U32), draw(U16), draw(U16)
    return 0x20010000 << 96 | server << 64 | flags << 48 | (port ^ 0xFFFF) << 32 | (v4 ^ 0xFFFFFFFF)


def nat64(v4: int, draw) -> int:  # 64:ff9b::a.b.c.d (RFC 6052 well-known prefix)
    return 0x0064FF9B << 96 | v4


def nat64_local(v4: int, draw) -> int:  # 64:ff9b:1::/48 in RFC 6052's /48 layout (u octet 0)
    return 0x0064FF9B0001 << 80 | (v4 >> 16) << 64 | (v4 & 0xFFFF) << 40 | draw(st.integers(0, 2**40 - 1))


EMBEDDINGS = [mapped, compatible, six_to_four, teredo, nat64, nat64_local]


@given(data=st.data(), v4=non_public_v4(), embed=st.sampled_from(EMBEDDINGS))
def test_every_embedding_of_a_non_public_ipv4_is_refused(data, v4, embed):
    v6 = ipaddress.IPv6Address(embed(int(v4), data.draw))
    if embed not in (nat64_local,) and int(v6) > 1:  # the guard finds the same IPv4 address
        assert embedded_ipv4(v6) == v4, (embed.__name__, v6)
    with pytest.raises(HttpError) as err:
        check_public_host(str(v6), 80)  # a literal host
    assert err.value.reason == "private_address", err.value


@given(data=st.data(), v4=non_public_v4(), embed=st.sampled_from(EMBEDDINGS))
def test_a_resolver_answer_embedding_a_non_public_ipv4_is_refused(data, v4, embed, monkeypatch_module):
    """The check the connection relies on (``resolve_checked``, on getaddrinfo's rows)."""
    v6 = ipaddress.IPv6Address(embed(int(v4), data.draw))
    row = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (str(v6), 80, 0, 0))
    monkeypatch_module.setattr(socket, "getaddrinfo", lambda *a, **k: [row])
    with pytest.raises(HttpError) as err:
        resolve_checked("embedded.test", 80, public_only=True)
    assert err.value.reason == "private_address" and str(v6) in err.value.detail, err.value


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@given(data=st.data())
def test_6to4_of_a_public_ipv4_passes(data):
    """The check refuses what the IPv4 address inside makes non-public, not every 6to4 address."""
    v6 = ipaddress.IPv6Address(six_to_four(int(PUBLIC_V4), data.draw))
    assert embedded_ipv4(v6) == PUBLIC_V4
    check_public_host(str(v6), 80)


@pytest.mark.parametrize(
    "host",
    [
        "2002:7f00:1::1",  # the example: 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1 (XOR-ed)
        "64:ff9b::7f00:1",
        "64:ff9b::10.0.0.7",
        "64:ff9b:1::a00:7",
        "::127.0.0.1",
        "::ffff:169.254.169.254",
    ],
)
def test_known_embeddings_are_refused(host):
    with pytest.raises(HttpError) as err:
        check_public_host(host, 443)
    assert err.value.reason == "private_address", err.value
