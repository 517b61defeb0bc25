"""HTTP requests bounded as a whole: a deadline for the request, not for each socket read.

``requests``' ``timeout`` bounds the connect and then *each* read of the socket: a server that
trickles one byte a second never trips a 2 s read timeout, and the call hangs for as long as the
server likes (holding, for a VLM request, a GPU slot of the run). :class:`DeadlineSession` adds
``deadline=`` to ``request``: a watchdog timer that, when the deadline passes, shuts the request's
socket down whatever the request is doing (sending, waiting for headers, reading the body), so
the blocked read returns at once and the call raises :class:`DeadlineExceeded`.

The watchdog finds the socket through the connection classes the session's adapter gives
urllib3's pools: each connection, when it connects or starts a request, registers itself with
the watch of the thread using it. A session is used by one thread at a time (``requests``
sessions are not thread-safe anyway), so a thread's watch sees only its own request.
"""

from __future__ import annotations

import socket
import threading

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

_current = threading.local()  # .watch: the _Watch of the request this thread is making


class DeadlineExceeded(requests.Timeout):
    """The whole request (connect, send, headers, body) took longer than its deadline."""


class _Watch:
    """One request's deadline: remembers its connection; ``cut`` shuts that connection down."""

    def __init__(self) -> None:
        self.connection: HTTPConnection | None = None
        self.expired = False
        self._lock = threading.Lock()

    def attach(self, connection: HTTPConnection) -> None:
        with self._lock:
            self.connection = connection
            expired = self.expired
        if expired:  # the deadline passed while this connection was being opened
            _shutdown(connection)

    def cut(self) -> None:
        with self._lock:
            self.expired = True
            connection = self.connection
        if connection is not None:
            _shutdown(connection)


def _shutdown(connection: HTTPConnection) -> None:
    sock = getattr(connection, "sock", None)
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a read or write blocked in another thread
    except OSError:
        pass  # already closed


class _Watched:
    """Registers the connection with the current thread's watch when it is used."""

    def _attach(self) -> None:
        watch = getattr(_current, "watch", None)
        if watch is not None:
            watch.attach(self)  # type: ignore[arg-type]

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self._attach()

    def request(self, *args, **kwargs) -> None:
        self._attach()  # a kept-alive connection starts its next request here, without connect
        super().request(*args, **kwargs)  # type: ignore[misc]


class _WatchedHTTPConnection(_Watched, HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, HTTPSConnection):
    pass


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class _WatchedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}


class DeadlineSession(requests.Session):
    """A ``requests.Session`` whose requests take ``deadline=`` seconds for the whole request.

    With a deadline the body is read inside the call (``stream=True`` is refused: a streamed
    body would be read after the deadline's watch ended), and the per-read ``timeout`` is at
    most the deadline too. Proxied connections are not watched (their pools are urllib3's own);
    the per-read timeout still bounds them."""

    def __init__(self) -> None:
        super().__init__()
        adapter = _WatchedAdapter()
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def request(self, method, url, *args, deadline: float | None = None, **kwargs) -> requests.Response:
        if deadline is None:
            return super().request(method, url, *args, **kwargs)
        if deadline <= 0:
            raise ValueError(f"deadline must be positive, got {deadline}")
        if kwargs.get("stream"):
            raise ValueError("a request with a deadline reads its body inside the call: stream=True is not supported")
        kwargs["timeout"] = _capped(kwargs.get("timeout"), deadline)
        watch = _Watch()
        timer = threading.Timer(deadline, watch.cut)
        timer.daemon = True
        _current.watch = watch
        timer.start()
        try:
            response = super().request(method, url, *args, **kwargs)
        except requests.RequestException as exc:
            if watch.expired:
                raise DeadlineExceeded(f"no complete answer within the {deadline:g} s deadline") from exc
            raise
        finally:
            timer.cancel()
            _current.watch = None
        if watch.expired:
            # cut inside the headers, http.client takes the end of the stream for the end of the
            # headers and of a body without Content-Length: an empty 200 that is no answer at all
            response.close()
            raise DeadlineExceeded(f"no complete answer within the {deadline:g} s deadline")
        return response


def _capped(timeout, deadline: float):
    """``requests``' timeout (a number or a (connect, read) pair), no part longer than ``deadline``."""
    if timeout is None:
        return deadline
    if isinstance(timeout, tuple):
        return tuple(deadline if t is None else min(t, deadline) for t in timeout)
    return min(timeout, deadline)
