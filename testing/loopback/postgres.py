"""A throwaway PostgreSQL server on 127.0.0.1 for tests: Debian's binaries, a fresh data directory.

``initdb`` and ``postgres`` refuse to run as root, and tests run as root here and in CI, so as
root every server command runs as the ``postgres`` system user (``runuser``) in a data directory
made for it under ``/tmp`` (pytest's own tmp directories are private to root). The server listens
on a free loopback port with its Unix socket in that directory, requires a password over TCP
(SCRAM), and is stopped and deleted on exit even when the test fails.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SYSTEM_USER = "postgres"


@dataclass(frozen=True)
class PostgresServer:
    """Where the server listens and how to log in; ``db`` exists and is empty."""

    host: str
    port: int
    user: str
    password: str
    db: str
    log: Path

    def dagster_env(self) -> dict[str, str]:
        """The variables ``deploy/dagster-cluster.yaml`` reads."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_DB": self.db,
        }

    def connect(self):
        """A psycopg2 connection (autocommit) to ``db``."""
        import psycopg2

        conn = psycopg2.connect(
            host=self.host, port=self.port, user=self.user, password=self.password, dbname=self.db, connect_timeout=10
        )
        conn.autocommit = True
        return conn

    def query(self, sql: str, *args, fetch: bool = True) -> list[tuple]:
        """``sql`` with ``args`` on a connection of its own; the rows, unless ``fetch`` is off."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall() if fetch else []
        finally:
            conn.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_server_user() -> list[str]:
    """The prefix that runs a command as a user PostgreSQL accepts (none when not root)."""
    return ["runuser", "-u", SYSTEM_USER, "--"] if os.geteuid() == 0 else []


def _own(path: Path) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SYSTEM_USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _run(cmd: list[str], cwd: Path) -> None:
    done = subprocess.run(_as_server_user() + cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def _kill_postmaster(data: Path) -> None:
    """The last resort when ``pg_ctl stop`` fails: the server this module started, by its pid."""
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass


@contextmanager
def postgres_server(bindir: Path, user: str = "panelforge", db: str = "dagster") -> Iterator[PostgresServer]:
    """Start a server from ``bindir`` (``testing.system.postgres_bindir()``); always stop it."""
    root = Path(tempfile.mkdtemp(prefix="panelforge-pg-"))
    data, pwfile = root / "data", root / "pwfile"
    password = secrets.token_urlsafe(18)
    started = False
    try:
        _own(root)
        pwfile.write_text(password + "\n")
        _own(pwfile)
        _run(
            [str(bindir / "initdb"), "-D", str(data), "-U", user, f"--pwfile={pwfile}", "--auth-host=scram-sha-256",
             "--auth-local=trust", "-E", "UTF8", "--locale=C"],
            cwd=root,
        )  # fmt: skip
        pwfile.unlink()
        port = _free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
        _run([str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "server.log"), "-w", "start"],
             cwd=root)  # fmt: skip
        started = True
        # the database over the Unix socket (trusted, local only): TCP logins need the password
        _run([str(bindir / "createdb"), "-h", str(root), "-p", str(port), "-U", user, db], cwd=root)
        yield PostgresServer("127.0.0.1", port, user, password, db, root / "server.log")
    finally:
        if started:
            try:
                _run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], cwd=root)
            except (RuntimeError, subprocess.TimeoutExpired):
                _kill_postmaster(data)
        shutil.rmtree(root, ignore_errors=True)
