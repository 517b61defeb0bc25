"""A loopback S3-compatible server (the subset PanelForge reads) over a local directory.

Path-style bucket URLs (``http://127.0.0.1:PORT/<bucket>``), anonymous access, ``GET`` of
objects with ``Range``, and ListObjectsV2 (``?list-type=2`` with prefix, delimiter,
max-keys and continuation tokens) answered with the real S3 XML namespace. The server counts
the requests it is answering at once (``max_in_flight``), which is how tests check a client's
concurrency bound; the plan's ``latency`` holds every answer back, as S3's first-byte latency.
"""

from __future__ import annotations

import hashlib
import os
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Self
from xml.sax.saxutils import escape

from testing.loopback.base import LoopbackHttpServer, send_body
from testing.loopback.faults import FaultPlan

NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def _keys(root: Path) -> list[str]:
    keys = []
    for base, _dirs, files in os.walk(root):
        for name in files:
            keys.append(os.path.relpath(os.path.join(base, name), root).replace(os.sep, "/"))
    return sorted(keys)


class S3LoopbackServer(LoopbackHttpServer):
    """Serve ``root`` as bucket ``bucket`` on 127.0.0.1; use as a context manager."""

    def __init__(self, root: str | os.PathLike[str], bucket: str = "pmc-oa-opendata", plan: FaultPlan | None = None):
        self.root = Path(root)
        self.bucket = bucket
        self.plan = plan or FaultPlan()
        self.in_flight = 0
        self.max_in_flight = 0
        self.connections = 0  # TCP connections accepted: fewer than requests means keep-alive
        self._flight_lock = threading.Lock()

    def _enter(self) -> None:
        with self._flight_lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._flight_lock:
            self.in_flight -= 1

    @property
    def url(self) -> str:
        return f"{self.address}/{self.bucket}"

    def start(self) -> Self:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def setup(self) -> None:  # once per connection, however many requests it carries
                with server._flight_lock:
                    server.connections += 1
                super().setup()

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                server._enter()
                self._counted = True
                try:
                    self._answer()
                finally:
                    self._handed_over()

            def _handed_over(self) -> None:
                """The request stops counting as its body goes to the socket: the client may read
                it and send its next request before this handler returns, and counting until then
                would see one request more at once than the client ever had open."""
                if self._counted:
                    self._counted = False
                    server._leave()

            def _answer(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
                path = urllib.parse.unquote(parts.path)
                method = "GET-RANGE" if self.headers.get("Range") else "GET"
                fault = server.plan.record(method, path + ("?" + parts.query if parts.query else ""))
                if fault and fault.kind == "status":
                    self._status(fault.status, fault.retry_after)
                    return
                bucket, _, key = path.lstrip("/").partition("/")
                if bucket != server.bucket:
                    self._status(404)
                elif not key and query.get("list-type") == "2":
                    self._list(query)
                else:
                    self._object(key, fault)

            def _status(self, status: int, retry_after: int | None = None) -> None:
                body = f"<Error><Code>{status}</Code></Error>".encode()
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", str(retry_after))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self._handed_over()
                self.wfile.write(body)

            def _list(self, query: dict) -> None:
                prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
                max_keys = int(query.get("max-keys", "1000"))
                after = query.get("continuation-token", "")
                entries: list[tuple[str, bool]] = []
                for key in _keys(server.root):
                    if not key.startswith(prefix):
                        continue
                    rest = key[len(prefix) :]
                    if delimiter and delimiter in rest:
                        entry = (prefix + rest.split(delimiter, 1)[0] + delimiter, True)
                        if entries and entries[-1] == entry:
                            continue
                        entries.append(entry)
                    else:
                        entries.append((key, False))
                entries = [e for e in entries if e[0] > after]
                page, truncated = entries[:max_keys], len(entries) > max_keys
                xml = [f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="{NS}">']
                xml.append(
                    f"<Name>{server.bucket}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(page)}</KeyCount>"
                )
                xml.append(
                    f"<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"
                )
                if truncated:
                    xml.append(f"<NextContinuationToken>{escape(page[-1][0])}</NextContinuationToken>")
                for name, is_prefix in page:
                    if is_prefix:
                        xml.append(f"<CommonPrefixes><Prefix>{escape(name)}</Prefix></CommonPrefixes>")
                    else:
                        data = (server.root / name).read_bytes()
                        etag = hashlib.md5(data, usedforsecurity=False).hexdigest()
                        xml.append(
                            f"<Contents><Key>{escape(name)}</Key><Size>{len(data)}</Size>"
                            f"<ETag>&quot;{etag}&quot;</ETag></Contents>"
                        )
                xml.append("</ListBucketResult>")
                body = "".join(xml).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self._handed_over()
                self.wfile.write(body)

            def _object(self, key: str, fault) -> None:
                target = (server.root / key).resolve()
                if not key or not target.is_relative_to(server.root.resolve()) or not target.is_file():
                    self._status(404)
                    return
                data = target.read_bytes()
                start = 0
                ranged = self.headers.get("Range", "")
                if ranged.startswith("bytes="):
                    start = int(ranged[6:].split("-", 1)[0] or 0)
                    if start >= len(data):
                        self._status(416)
                        return
                body = data[start:]
                self.send_response(206 if ranged else 200)
                if ranged:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self._handed_over()
                send_body(self, body, fault)

        return self._serve(Handler, "s3-loopback")
