"""A deadline on one whole HTTP request (connect, headers and body; every retry and redirect hop
of one ``get`` together), not only on its body.

Why: ``requests`` bounds each socket operation, so a server dripping its headers a byte at a time
keeps a request alive for hours. A timer thread shuts down the request's sockets (registered by
the :class:`Watched` connections) once the deadline passes; signals reach only the main thread and
Beam runs DoFns in threads. What a cut read raises varies, so callers check
:attr:`Deadline.expired` after the request. DNS and the TCP connect are bounded by ``timeout``."""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from types import TracebackType

from urllib3.response import BaseHTTPResponse

TIMER_NAME = "http-deadline"
_active = threading.local()  # .deadline: the Deadline of the request this thread is sending


class Deadline:
    """``max_seconds`` for one request, from now; ``None`` for no deadline (nothing is started).

    Use as a context manager around the request: on exit the timer is cancelled and the
    deadline forgets its sockets, so a connection the pool hands to a later request is never
    shut down by this one's timer, as long as one thread uses the session at a time (each
    ``PoliteClient`` thread has its own session; an ``HttpFetcher`` shared by threads would not
    keep that promise after a redirect hop). The deadline holds duplicates (``os.dup``) of the sockets:
    shutting a duplicate down ends the connection for every descriptor of it (also once TLS
    has taken the original socket object over), and closing it leaves the connection open.
    """

    def __init__(self, max_seconds: float | None):
        self.max_seconds = max_seconds
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._fired = False
        self._done = False
        self._outer: Deadline | None = None
        self._timer: threading.Timer | None = None
        self._started = time.monotonic()
        if max_seconds is not None:
            self._timer = threading.Timer(max_seconds, self._fire)
            self._timer.name = TIMER_NAME
            self._timer.daemon = True

    @property
    def expired(self) -> bool:
        """Whether the timer has cut this request off (its outcome must not be trusted)."""
        return self._fired

    @property
    def remaining(self) -> float:
        """Seconds left (``inf`` without a deadline): a caller about to wait longer gives up now."""
        if self.max_seconds is None:
            return math.inf
        return self.max_seconds - (time.monotonic() - self._started)

    def watch(self, sock: socket.socket | None) -> None:
        """Shut ``sock`` down when the deadline passes (at once if it has passed already)."""
        if self._timer is None or sock is None:
            return
        # Not sock.dup(): an SSLSocket refuses to be duplicated, and urllib3's TLS-in-TLS
        # wrapper is no socket at all; both have the descriptor of the TCP socket.
        try:
            fd = os.dup(sock.fileno())
        except OSError:  # closed already: nothing to cut
            return
        try:
            dup = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            return
        with self._lock:
            if not self._done:
                self._socks.append(dup)
                if self._fired:
                    _shutdown(dup)
                return
        dup.close()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self._fired = True
            for sock in self._socks:
                _shutdown(sock)

    def __enter__(self) -> Deadline:
        self._outer = getattr(_active, "deadline", None)
        _active.deadline = self
        self._started = time.monotonic()
        if self._timer is not None:
            self._timer.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _active.deadline = self._outer
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._done = True
            socks, self._socks = self._socks, []
        for sock in socks:
            sock.close()


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected (any more): the read has ended or fails on its own
        pass


def _watch(sock: socket.socket | None) -> None:
    deadline = getattr(_active, "deadline", None)
    if deadline is not None:
        deadline.watch(sock)


class Watched:
    """A urllib3 connection that registers its socket with the thread's active deadline when it
    opens one (before any TLS handshake) and before it reads each response (a pooled connection
    is connected already). Mixed in before HTTPConnection or HTTPSConnection."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        _watch(sock)
        return sock

    def getresponse(self) -> BaseHTTPResponse:
        _watch(self.sock)  # type: ignore[attr-defined]
        return super().getresponse()  # type: ignore[misc]
