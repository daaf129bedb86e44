"""A private PostgreSQL cluster (``initdb`` + ``postgres``) on a free port, for tests and
benchmarks; stop/start keeps its data.  Nothing here touches a machine's PostgreSQL (5432).

PostgreSQL refuses to run as root: when we are root, ``initdb`` and ``postgres`` run as the
``postgres`` system user (created with ``useradd --system`` if absent) and the data directory
is chowned to it.  A missing binary raises :class:`~gcs.testing.processes.MissingServerBinary`
naming the apt package (``scripts/ensure_services.sh`` installs it).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gcs.testing.ports import HOST, free_port
from gcs.testing.processes import find_binary, stop_process, wait_until

__all__ = ["PostgresServer", "postgres_server"]


_START_ATTEMPTS = 3
"""Tries of initdb, and of the postmaster's start, before a crash by signal is reported."""


def _crashed_by_signal(result: subprocess.CompletedProcess[bytes]) -> bool:
    """initdb died of a signal, or exited saying its bootstrap backend did."""
    return result.returncode < 0 or (
        result.returncode != 0 and b"terminated by signal" in (result.stderr or b"")
    )


def _postgres_user() -> pwd.struct_passwd | None:
    """The account to run PostgreSQL as: ``None`` (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres"],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam("postgres")


@dataclass
class PostgresServer:
    """A private PostgreSQL cluster (``initdb`` + ``postgres``) with trust auth on localhost.

    ``fsync=False`` (default) trades crash safety of the *test* server for speed; stop/start
    keeps data either way.
    """

    port: int = field(default_factory=free_port)
    fsync: bool = False
    startup_timeout_s: float = 120.0
    """Generous: it only bounds a hang (an exit is seen at once); initdb plus start took
    over 40 s with six clusters starting at once on a loaded 2-core machine."""
    superuser: str = "postgres"
    directory: pathlib.Path | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _initialised: bool = field(default=False, init=False, repr=False)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.superuser}@{HOST}:{self.port}/{database}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _run_as(self) -> dict[str, Any]:
        account = _postgres_user()
        if account is None:
            return {}
        return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def _init(self) -> None:
        initdb = find_binary("initdb", package="postgresql")
        if self.directory is None:
            self.directory = pathlib.Path(tempfile.mkdtemp(prefix="gcs-postgres-"))
        (self.directory / "socket").mkdir(exist_ok=True)
        account = _postgres_user()
        if account is not None:
            for path in (self.directory, self.directory / "socket"):
                os.chown(path, account.pw_uid, account.pw_gid)
        # initdb has been seen to die of SIGSEGV here when several test workers run it at
        # once (-n 4 on 2 cores); a crash by signal (of initdb or of the bootstrap backend
        # it runs) is retried on a fresh data directory, any other failure is not.
        for attempt in range(_START_ATTEMPTS):
            result = subprocess.run(
                [initdb, "-D", str(self.directory / "data"), "-U", self.superuser,
                 "--auth=trust", "--encoding=UTF8", "--no-sync", "--no-instructions"],
                check=False,
                capture_output=True,
                cwd=self.directory,
                **self._run_as(),
            )  # fmt: skip
            if not _crashed_by_signal(result) or attempt == _START_ATTEMPTS - 1:
                break
            shutil.rmtree(self.directory / "data", ignore_errors=True)
            time.sleep(0.5)
        result.check_returncode()
        self._initialised = True

    def start(self) -> PostgresServer:
        if self.running:
            return self
        if not self._initialised:
            self._init()
        assert self.directory is not None
        binary = find_binary("postgres", package="postgresql")
        args = [
            binary,
            "-D", str(self.directory / "data"),
            "-p", str(self.port),
            "-k", str(self.directory / "socket"),
            "-c", f"listen_addresses={HOST}",
            "-c", f"fsync={'on' if self.fsync else 'off'}",
            "-c", "max_connections=100",
            "-c", "shared_buffers=32MB",
        ]  # fmt: skip
        # The postmaster has been seen to die of SIGSEGV while starting (once in four full
        # suite runs, -n 4 on a loaded 2-core machine, like initdb above): a crash by signal
        # before it is ready is retried on the same data directory; any other exit is not.
        attempt = 1
        while True:
            self._proc = self._spawn(args)
            try:
                # each probe forks pg_isready: probe less often than the default
                wait_until(
                    self._ready,
                    timeout_s=self.startup_timeout_s,
                    what="postgres",
                    proc=self._proc,
                    interval_s=0.1,
                )
            except RuntimeError:
                if self._proc.returncode >= 0 or attempt == _START_ATTEMPTS:
                    raise
                attempt += 1
                time.sleep(0.5)
                continue
            return self

    def _spawn(self, args: list[str]) -> subprocess.Popen[bytes]:
        assert self.directory is not None
        log = (self.directory / "postgres.log").open("ab")
        try:
            return subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.directory,
                **self._run_as(),
            )  # fmt: skip
        finally:
            log.close()

    def _ready(self) -> bool:
        isready = find_binary("pg_isready", package="postgresql")
        result = subprocess.run(
            [isready, "-h", HOST, "-p", str(self.port), "-U", self.superuser, "-q"],
            check=False,
            capture_output=True,
        )
        return result.returncode == 0

    def stop(self, *, kill: bool = False) -> None:
        """Fast shutdown (SIGINT; ``kill=True``: SIGKILL).  Data stays for ``start()``."""
        stop_process(self._proc, signal.SIGKILL if kill else signal.SIGINT, 30.0)
        self._proc = None

    def create_database(self, name: str) -> str:
        """Create database ``name`` (a SQL identifier) and return its URL."""
        psql = find_binary("psql", package="postgresql")
        subprocess.run(
            [psql, "-h", HOST, "-p", str(self.port), "-U", self.superuser, "-d", "postgres",
             "-v", "ON_ERROR_STOP=1", "-q", "-c", f'CREATE DATABASE "{name}"'],
            check=True,
            capture_output=True,
        )  # fmt: skip
        return self.url(name)

    def cleanup(self) -> None:
        self.stop()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            self._initialised = False


@contextlib.contextmanager
def postgres_server(**kwargs: Any) -> Iterator[PostgresServer]:
    server = PostgresServer(**kwargs).start()
    try:
        yield server
    finally:
        server.cleanup()
