"""What every loopback stand-in shares: start on 127.0.0.1, stop, use as a context manager."""

from __future__ import annotations

import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class LoopbackServer:
    """A server started by tests, benchmarks and ``make demo``; subclasses implement ``start``."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class LoopbackHttpServer(LoopbackServer):
    """A threaded HTTP server on a free loopback port."""

    _server: ThreadingHTTPServer | None = None
    # How often the serving loop checks for ``stop``: ``shutdown`` waits up to this long, and the
    # tests start and stop hundreds of these servers (socketserver's default is 0.5 s).
    POLL_INTERVAL = 0.02

    def _serve(self, handler: type[BaseHTTPRequestHandler], name: str) -> Self:
        # TCP_NODELAY on every connection, as real HTTP servers set it. ``http.server`` sends the
        # headers and the body in two writes; with Nagle's algorithm on, a body smaller than a
        # segment waits for the client's delayed ACK of the headers (40 ms on Linux), so every
        # small response on a keep-alive connection took 40 ms more than it should.
        handler.disable_nagle_algorithm = True
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": self.POLL_INTERVAL}, name=name, daemon=True
        ).start()
        return self

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def send_body(handler: BaseHTTPRequestHandler, body: bytes, fault=None) -> None:
    """Write ``body`` (headers already sent), or, for a ``drop`` fault, only the fault's fraction
    of it before cutting the connection, as a transfer broken mid-way."""
    if fault is not None and fault.kind == "drop":
        handler.wfile.write(body[: int(len(body) * fault.fraction)])
        handler.wfile.flush()
        handler.close_connection = True
        handler.connection.shutdown(2)
        return
    handler.wfile.write(body)


def trickle(handler: BaseHTTPRequestHandler, status: int, body: bytes, interval: float) -> None:
    """Send a whole HTTP response (status line, headers, body) one byte every ``interval``
    seconds, until it is sent or the client hangs up: no read ever waits ``interval`` long."""
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    handler.close_connection = True
    for byte in head + body:
        try:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
        except OSError:  # the client gave up
            return
        time.sleep(interval)
