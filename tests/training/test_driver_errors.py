"""The one-line errors of joining a Ray cluster (``training.ray_session.connect_ray``)."""

import socket

import pytest

from schemas.errors import MmlinksError
from training.ray_session import _join_error, probe_ray_address


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:
        return exc


def test_a_refused_token_is_named_without_ray_s_traceback():
    # what ray.init raised for a token-protected cluster joined without its token (Ray 2.5x)
    exc = _chained(
        ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6390"),
        RuntimeError(
            "Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
            "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token "
            "is missing or incorrect."
        ),
    )
    msg = str(_join_error("192.0.2.2:6390", exc))
    assert "\n" not in msg
    assert msg.startswith("cannot join the Ray cluster at 192.0.2.2:6390: it refused this process's token")
    assert "RAY_AUTH_TOKEN" in msg


def test_another_join_failure_keeps_ray_s_first_line():
    msg = str(_join_error("10.0.0.9:6379", ConnectionError("Failed to connect to Ray cluster\nat 10.0.0.9")))
    assert msg == "cannot join the Ray cluster at 10.0.0.9:6379: Failed to connect to Ray cluster"


def test_an_address_where_nothing_listens_is_refused_in_seconds():
    with socket.socket() as s:  # a port that was just free: nothing listens on it now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(
            MmlinksError, match=rf"^cannot join the Ray cluster at {address}: nothing answers there"
        ):
            probe_ray_address(address)
    probe_ray_address("auto")  # resolved by Ray, not probed


def test_a_listening_address_passes_the_probe():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        probe_ray_address(f"127.0.0.1:{s.getsockname()[1]}")
