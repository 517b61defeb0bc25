"""Byte transports for article sources: S3 REST over HTTP(S), FTP (ftputil), local files.

A transport only moves bytes: list a "directory", read a small object, download a file with
resume. Every request goes through the shared :class:`RateLimiter` and the retry policy;
failures are mapped to :class:`TransientError` (retried) or :class:`PermanentError`. When the
retries of a request run out, or the source cannot be reached or logged into at all, the
transport raises :class:`SourceUnavailableError`: an outage, not a fact about the file.
"""

from __future__ import annotations

import ftplib
import os
import re
import shutil
import threading
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import ftputil
import ftputil.error
import requests
import urllib3
from lxml import etree

from pipelines.net.ratelimit import RateLimiter
from pipelines.net.retry import (
    RETRYABLE_STATUS,
    PermanentError,
    RetryPolicy,
    SourceUnavailableError,
    TransientError,
)

CHUNK = 1 << 16
# FTP commands that count as requests against a mirror's limit: transfers, listings, sizes. A
# login counts too, as one request, from the moment the connection opens (FtpTransport).
COUNTED_FTP_COMMANDS = frozenset({"RETR", "SIZE", "LIST", "NLST", "MLSD", "MLST", "MDTM", "STAT"})
S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
SAFE_XML = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)


class Transport(ABC):
    """Common bookkeeping: request and byte counters, rate limiting and retries."""

    scheme = "abstract"
    where = "?"  # names the source in SourceUnavailableError

    def __init__(self, limiter: RateLimiter, retry: RetryPolicy, max_in_flight: int | None = None):
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.limiter = limiter
        self.retry = retry
        self.max_in_flight = max_in_flight
        # One of ``max_in_flight`` places is held while a request and its body are on the wire.
        # Taken *before* the rate-limit slot: a request that took its slot and then waited here
        # would go out late, and late requests bunch up at the server above the rate. Streaming
        # bodies keep their place until the last chunk is on disk, so a process holds at most
        # ``max_in_flight`` connections busy and ``max_in_flight x CHUNK`` bytes of bodies.
        self._in_flight = threading.BoundedSemaphore(max_in_flight) if max_in_flight else nullcontext()
        self._counter_lock = threading.Lock()
        self.requests = 0
        self.bytes = 0

    def _request(self) -> None:
        self.limiter.acquire()
        with self._counter_lock:
            self.requests += 1

    def _received(self, n: int) -> None:
        with self._counter_lock:
            self.bytes += n

    @abstractmethod
    def list(self, directory: str) -> Iterator[str]:
        """Yield the names directly inside ``directory`` ("" is the root); sub-directories end with ``/``."""

    def walk(self) -> Iterator[tuple[str, str]]:
        """Yield ``(key, etag)`` for every object under the root (cloud layout only)."""
        raise NotImplementedError(f"{self.scheme} sources serve the legacy layout, which is not walked")

    @abstractmethod
    def _read_once(self, path: str) -> bytes: ...

    @abstractmethod
    def _download_once(self, path: str, partial: Path) -> None:
        """Append the rest of ``path`` to ``partial`` (which may already hold a prefix)."""

    def _retry(self, fn, what: str):
        """``fn`` under the retry policy; retries running out mean the source is unavailable."""
        return self.retry.call(fn, what, host=self.where)

    def read_bytes(self, path: str) -> bytes:
        return self._retry(lambda: self._read_once(path), f"read {path}")

    def download(self, path: str, dest: Path) -> Path:
        """Download ``path`` to ``dest``; an interrupted transfer resumes from ``dest.part``."""
        if dest.exists():
            return dest
        partial = dest.with_name(dest.name + ".part")
        self._retry(lambda: self._download_once(path, partial), f"download {path}")
        os.replace(partial, dest)
        return dest

    def close(self) -> None:  # noqa: B027 - optional hook: most transports hold no connection
        """Release connections."""


class HttpTransport(Transport):
    """An S3-compatible bucket over HTTP(S): ListObjectsV2 for listings, ranged GETs for resume."""

    scheme = "http"

    def __init__(
        self,
        base_url: str,
        limiter: RateLimiter,
        retry: RetryPolicy,
        timeout: float = 60.0,
        max_in_flight: int | None = None,
    ):
        super().__init__(limiter, retry, max_in_flight)
        self.base_url = base_url.rstrip("/")
        self.where = urllib.parse.urlsplit(self.base_url).netloc or self.base_url
        self.timeout = timeout
        self._local = threading.local()

    @property
    def _session(self) -> requests.Session:
        """One keep-alive session per thread: a thread's requests reuse its connection (no TCP or
        TLS handshake per object), and no session is shared across threads."""
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def _get(self, url: str, **kwargs) -> requests.Response:
        self._request()
        try:
            response = self._session.get(url, timeout=self.timeout, **kwargs)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise TransientError(f"{type(exc).__name__} on {url}") from exc
        if response.status_code in RETRYABLE_STATUS:
            retry_after = response.headers.get("Retry-After")
            response.close()
            raise TransientError(
                f"HTTP {response.status_code} on {url}",
                retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None,
            )
        if response.status_code >= 400:
            response.close()
            raise PermanentError(f"HTTP {response.status_code} on {url}")
        return response

    def _url(self, path: str) -> str:
        return f"{self.base_url}/{urllib.parse.quote(path.lstrip('/'))}"

    def _pages(self, prefix: str, delimiter: str | None) -> Iterator[tuple[etree._Element, str]]:
        """ListObjectsV2 pages under ``prefix``, following continuation tokens."""
        token: str | None = None
        while True:
            params = {"list-type": "2", "prefix": prefix}
            if delimiter:
                params["delimiter"] = delimiter
            if token:
                params["continuation-token"] = token
            body = self._retry(lambda p=dict(params): self._list_page(p), f"list {prefix!r}")
            root = etree.fromstring(body, SAFE_XML)
            ns = S3_NS if root.tag.startswith(S3_NS) else ""
            yield root, ns
            if root.findtext(f"{ns}IsTruncated") != "true":
                return
            token = root.findtext(f"{ns}NextContinuationToken")

    def _list_page(self, params: dict) -> bytes:
        with self._in_flight, self._get(f"{self.base_url}/", params=params) as response:
            return self._read_body(response, self.base_url)

    def list(self, directory: str) -> Iterator[str]:
        prefix = directory.strip("/") + "/" if directory.strip("/") else ""
        for root, ns in self._pages(prefix, "/"):
            for node in root.iter(f"{ns}CommonPrefixes"):
                yield node.findtext(f"{ns}Prefix")[len(prefix) :]
            for node in root.iter(f"{ns}Contents"):
                yield node.findtext(f"{ns}Key")[len(prefix) :]

    def walk(self) -> Iterator[tuple[str, str]]:
        for root, ns in self._pages("", None):
            for node in root.iter(f"{ns}Contents"):
                yield node.findtext(f"{ns}Key"), (node.findtext(f"{ns}ETag") or "").strip('"')

    def _read_once(self, path: str) -> bytes:
        with self._in_flight, self._get(self._url(path)) as response:
            data = self._read_body(response, self._url(path))
        self._received(len(data))
        return data

    @staticmethod
    def _read_body(response: requests.Response, url: str) -> bytes:
        try:
            return response.content
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
            raise TransientError(f"connection dropped while reading {url}") from exc

    def _download_once(self, path: str, partial: Path) -> None:
        with self._in_flight:
            self._stream_to(path, partial)

    def _stream_to(self, path: str, partial: Path) -> None:
        """GET ``path`` into ``partial`` chunk by chunk: memory is one chunk, whatever the size."""
        offset = partial.stat().st_size if partial.exists() else 0
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        url = self._url(path)
        try:
            response = self._get(url, headers=headers, stream=True)
        except PermanentError as exc:
            if offset and "HTTP 416" in str(exc):  # the partial file is already complete
                return
            raise
        with response:
            mode = "ab" if offset and response.status_code == 206 else "wb"
            expected = response.headers.get("Content-Length")
            received = 0
            try:
                with open(partial, mode) as fh:
                    # read1 returns whatever has arrived, so a dropped transfer keeps every byte
                    # it received; raw (undecoded) bytes are what the md5 describes
                    while chunk := response.raw.read1(CHUNK):
                        fh.write(chunk)
                        received += len(chunk)
            except (
                requests.ConnectionError,
                requests.exceptions.ChunkedEncodingError,
                urllib3.exceptions.HTTPError,
            ) as exc:
                raise TransientError(f"connection dropped after {received} bytes of {url}") from exc
            finally:
                self._received(received)
            if expected is not None and received != int(expected):
                raise TransientError(f"short read on {url}: {received} of {expected} bytes")


class FtpTransport(Transport):
    """A legacy-layout FTP mirror through ``ftputil``, with a pool of logged-in connections.

    ftputil opens a second (child) session for every file transfer. Every session is a login,
    and a login is a request to the mirror: the session takes a rate-limit slot *before* it
    opens its connection (a mirror sees the connection, then USER/PASS, as one login), so
    several threads that log in at once are spaced like any other requests. Connections are
    borrowed from a pool, so worker threads of successive shards reuse them instead of logging
    in again.
    """

    scheme = "ftp"

    def __init__(
        self,
        host: str,
        port: int,
        root: str,
        limiter: RateLimiter,
        retry: RetryPolicy,
        user: str = "anonymous",
        password: str = "anonymous@",
        timeout: float = 60.0,
    ):
        super().__init__(limiter, retry)
        self.host, self.port, self.root = host, port, "/" + root.strip("/")
        self.user, self.password, self.timeout = user, password, timeout
        self.where = f"{host}:{port}"
        self._idle: list[ftputil.FTPHost] = []
        self._pool_lock = threading.Lock()

    def _session_factory(self):
        transport, host, port, timeout = self, self.host, self.port, self.timeout

        class Session(ftplib.FTP):
            def putcmd(self, line: str) -> None:
                # The slot is taken the moment a counted command goes on the wire, so the
                # mirror sees the limit however ftputil interleaves CWD/PASV and child logins.
                if line.split(" ", 1)[0].upper() in COUNTED_FTP_COMMANDS:
                    transport._request()
                super().putcmd(line)

            def __init__(self, _host, user, password):
                super().__init__(timeout=timeout)
                transport._request()  # the login's slot, taken before the mirror sees the connection
                self.connect(host, port)
                self.login(user, password)
                self.set_pasv(True)
                self.voidcmd("TYPE I")  # SIZE is refused in ASCII mode

        return Session

    def _connect(self) -> ftputil.FTPHost:
        try:
            ftp = ftputil.FTPHost(self.host, self.user, self.password, session_factory=self._session_factory())
        except (ftputil.error.FTPOSError, OSError, EOFError) as exc:
            raise TransientError(f"cannot connect to ftp://{self.host}:{self.port}: {exc}") from exc
        except ftputil.error.TemporaryError as exc:
            raise TransientError(f"ftp login refused: {str(exc).splitlines()[0]}") from exc
        except ftputil.error.PermanentError as exc:  # no article can be fetched without a login
            raise SourceUnavailableError(self.where, f"ftp login failed: {str(exc).splitlines()[0]}") from exc
        ftp.stat_cache.disable()
        return ftp

    @staticmethod
    def _close_quietly(ftp: ftputil.FTPHost) -> None:
        try:
            ftp.close()
        except Exception:  # noqa: BLE001 - closing a connection that is already broken
            pass

    def _path(self, path: str) -> str:
        return f"{self.root.rstrip('/')}/{path.lstrip('/')}"

    def _guard(self, what: str, fn):
        """Run one FTP operation on a pooled connection, mapping errors to transient or permanent.

        A connection that failed in any way is closed, never returned to the pool.
        """
        with self._pool_lock:
            ftp = self._idle.pop() if self._idle else None
        ftp = ftp or self._connect()
        healthy = False
        try:
            result = fn(ftp)
            healthy = True
            return result
        except (ftputil.error.FTPError, ftplib.error_perm, ftplib.error_temp, ftplib.error_reply) as exc:
            first_line = str(exc).splitlines()[0]
            reply = re.search(r"\b([45]\d\d)\b", str(exc))
            if reply and reply.group(1).startswith("5"):
                healthy = True  # the session is fine; the file is not
                detail = "not found on server " if reply.group(1) == "550" else ""
                raise PermanentError(f"{what}: {detail}({first_line})") from exc
            raise TransientError(f"{what}: {first_line}") from exc  # 4xx (421 closes), disconnects
        except (OSError, EOFError, ftplib.Error) as exc:  # disconnects, timeouts, protocol breaks
            raise TransientError(f"{what}: {type(exc).__name__}: {exc}") from exc
        finally:
            if healthy:
                with self._pool_lock:
                    self._idle.append(ftp)
            else:
                self._close_quietly(ftp)

    def list(self, directory: str) -> Iterator[str]:
        def run(ftp):
            base = self._path(directory)
            return [n + "/" if ftp.path.isdir(ftp.path.join(base, n)) else n for n in ftp.listdir(base)]

        yield from self._retry(lambda: self._guard(f"list {directory}", run), f"list {directory}")

    def _read_once(self, path: str) -> bytes:
        def run(ftp):
            with ftp.open(self._path(path), "rb") as fh:
                return fh.read()

        data = self._guard(f"read {path}", run)
        self._received(len(data))
        return data

    def _download_once(self, path: str, partial: Path) -> None:
        """RETR with REST from the partial file's size.

        ftputil treats a 426 "transfer aborted" reply on close as normal (it is what early
        closes produce), so a dropped transfer is detected by comparing against the size the
        server lists, and resumed on the next attempt.
        """
        offset = partial.stat().st_size if partial.exists() else 0

        def size(ftp) -> int:
            # One SIZE command (ftputil's getsize would LIST every parent directory).
            return ftp._session.size(self._path(path))  # noqa: SLF001 - ftputil exposes no SIZE

        expected = self._guard(f"size {path}", size)
        if offset == expected:
            return
        if offset > expected:  # the file changed on the server: start over
            partial.unlink()
            offset = 0

        def run(ftp):
            received = 0
            try:
                with (
                    ftp.open(self._path(path), "rb", rest=offset or None) as src,
                    open(partial, "ab" if offset else "wb") as dst,
                ):
                    while chunk := src.read(CHUNK):
                        dst.write(chunk)
                        received += len(chunk)
            finally:
                self._received(received)
            if offset + received != expected:
                raise TransientError(f"short transfer of {path}: {offset + received} of {expected} bytes")

        self._guard(f"download {path}", run)

    def close(self) -> None:
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for ftp in idle:
            self._close_quietly(ftp)


class LocalTransport(Transport):
    """A directory on disk with either layout (``file:///path``); no network, same interface."""

    scheme = "file"

    def __init__(self, root: str, limiter: RateLimiter, retry: RetryPolicy):
        super().__init__(limiter, retry)
        self.root = Path(root)
        self.where = self.root.as_uri() if self.root.is_absolute() else str(self.root)

    def _request(self) -> None:
        super()._request()
        if not self.root.is_dir():  # an unmounted or vanished mirror, not a missing article
            raise SourceUnavailableError(self.where, f"source directory {self.root} does not exist")

    def _resolve(self, path: str) -> Path:
        full = (self.root / path.lstrip("/")).resolve()
        if not full.is_relative_to(self.root.resolve()):
            raise PermanentError(f"path {path!r} escapes the source root")
        return full

    def list(self, directory: str) -> Iterator[str]:
        self._request()
        for entry in sorted(os.scandir(self._resolve(directory)), key=lambda e: e.name):
            yield entry.name + ("/" if entry.is_dir() else "")

    def walk(self) -> Iterator[tuple[str, str]]:
        self._request()
        for base, dirs, names in os.walk(self.root):
            dirs.sort()
            for name in sorted(names):
                stat = os.stat(os.path.join(base, name))
                key = os.path.relpath(os.path.join(base, name), self.root).replace(os.sep, "/")
                yield key, f"{stat.st_size}-{stat.st_mtime_ns}"

    def _read_once(self, path: str) -> bytes:
        self._request()
        try:
            data = self._resolve(path).read_bytes()
        except FileNotFoundError as exc:
            raise PermanentError(f"read {path}: not found") from exc
        self._received(len(data))
        return data

    def _download_once(self, path: str, partial: Path) -> None:
        self._request()
        try:
            with open(self._resolve(path), "rb") as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, CHUNK)
        except FileNotFoundError as exc:
            raise PermanentError(f"download {path}: not found") from exc
        self._received(partial.stat().st_size)
