"""A loopback FTP server (pyftpdlib) serving a legacy-layout mirror, with fault injection.

Faults on ``RETR``: a reply code (``421`` closes the session as real servers do, any other
code is a plain error reply), or ``drop`` (send part of the file, then abort the transfer
with 426). Latency applies to every command, per connection thread.

The request log counts what a mirror's rate limit counts: each login once, as ``LOGIN`` at the
moment the client connects (before the banner, USER and PASS), and every transfer, listing and
size command.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import threading

from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.filesystems import AbstractedFS
from pyftpdlib.handlers import FTPHandler
from pyftpdlib.handlers.ftp.producers import FileProducer
from pyftpdlib.servers import ThreadedFTPServer

from testing.loopback.base import LoopbackServer
from testing.loopback.faults import FaultPlan


class _DroppingFile(io.BytesIO):
    """Reads like the file until ``cut`` bytes, then fails like a reset connection."""

    def __init__(self, data: bytes, cut: int, name: str):
        super().__init__(data)
        self.cut = cut
        self.name = name  # pyftpdlib logs the file name when the transfer ends

    def read(self, size: int = -1) -> bytes:
        if self.tell() >= self.cut:
            raise OSError(errno.ECONNRESET, "connection reset by peer")
        return super().read(min(size if size > 0 else self.cut, self.cut - self.tell()))


class _FolderCheckingFS(AbstractedFS):
    """pyftpdlib's ``chdir`` changes the process's working directory to the client's folder (its CWD
    handler changes it back). From the server's threads, with several clients at once, two of them
    interleave and leave the whole process in a mirror folder, which pytest removes when the test
    has passed: every later ``os.getcwd()`` of that process fails. Check the folder instead, with
    the errors ``os.chdir`` would raise, and leave the process where it is."""

    def chdir(self, path: str) -> None:
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        if not os.path.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        if not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        self.cwd = self.fs2ftp(path)


class FtpLoopbackServer(LoopbackServer):
    """Serve ``root`` read-only to anonymous users on 127.0.0.1; use as a context manager."""

    def __init__(self, root: str | os.PathLike[str], plan: FaultPlan | None = None):
        self.root = os.fspath(root)
        self.plan = plan or FaultPlan()
        self._server: ThreadedFTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.address[:2]
        return f"ftp://{host}:{port}/"

    def start(self) -> FtpLoopbackServer:
        plan, root = self.plan, self.root
        authorizer = DummyAuthorizer()
        authorizer.add_anonymous(root)

        class Handler(FTPHandler):
            def on_connect(self):
                plan.record("LOGIN", "", faulty=False)  # the connection is the login's request
                return super().on_connect()

            def pre_process_command(self, line, cmd, arg):
                self._fault = None
                if cmd in ("RETR", "LIST", "NLST", "MLSD", "SIZE", "MDTM", "STAT", "MLST"):
                    # log the absolute virtual path: clients CWD first and then RETR a bare name
                    path = self.fs.ftpnorm(arg) if arg else self.fs.cwd
                    self._fault = plan.record(cmd, path, faulty=cmd == "RETR")
                return super().pre_process_command(line, cmd, arg)

            def ftp_RETR(self, file):  # noqa: N802 - pyftpdlib API
                fault, resuming = getattr(self, "_fault", None), bool(self._restart_position)
                if fault is not None and fault.kind == "status":
                    self.respond(f"{fault.status} Service not available, closing control connection.")
                    if fault.status == 421:
                        self.close_when_done()
                    return None
                if fault is not None and fault.kind == "drop" and not resuming:
                    with open(file, "rb") as fh:
                        data = fh.read()
                    fd = _DroppingFile(data, int(len(data) * fault.fraction), file)
                    self.push_dtp_data(FileProducer(fd, self._current_type), isproducer=True, file=fd, cmd="RETR")
                    return file
                return super().ftp_RETR(file)

        Handler.authorizer = authorizer
        Handler.abstracted_fs = _FolderCheckingFS
        Handler.banner = "PanelForge loopback FTP"
        Handler.passive_ports = None
        ftp_log = logging.getLogger("pyftpdlib")
        ftp_log.setLevel(logging.WARNING)
        if not ftp_log.handlers:  # otherwise pyftpdlib installs its own stderr handler
            ftp_log.addHandler(logging.NullHandler())
        self._server = ThreadedFTPServer(("127.0.0.1", 0), Handler)
        self._server.max_cons = 256
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"handle_exit": False}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.close_all()
            self._server = None
