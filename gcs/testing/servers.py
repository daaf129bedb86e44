"""Private Redis and PostgreSQL servers for tests and benchmarks.

Each server runs on a free port in its own temporary directory and is torn down by
``stop()`` / the context manager.  They can be stopped and started again *on the same port
with the same data* to simulate an outage.  Nothing here touches a machine's default Redis
(6379) or PostgreSQL (5432).

PostgreSQL refuses to run as root: when we are root, ``initdb`` and ``postgres`` run as the
``postgres`` system user (created with ``useradd --system`` if absent) and the data directory
is chowned to it.  Missing binaries raise :class:`MissingServerBinary` naming the apt package
(``scripts/ensure_services.sh`` installs both).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MissingServerBinary",
    "PostgresServer",
    "RedisServer",
    "find_binary",
    "free_port",
    "postgres_server",
    "redis_server",
]

_HOST = "127.0.0.1"


class MissingServerBinary(RuntimeError):
    """A server binary is not installed; the message says which package provides it."""


_RESERVED_LOW = 20_000
"""Ports handed out by :func:`free_port` lie between this and the kernel's ephemeral range
(above Ray's default worker ports, 10002-19999)."""
_pick = random.SystemRandom()  # not the global generator: Hypothesis seeds that one


def _ephemeral_low() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A TCP port that was free a moment ago, for a server started later (often in another
    process, seconds later on a busy machine).

    Chosen at random *below* the ephemeral range: a port from ``bind(("", 0))`` is one the
    kernel also gives to every other ``bind(0)`` and outgoing connection, so with test
    workers in parallel another server could take it in the gap before ours binds it.
    """
    high = _ephemeral_low()
    for _ in range(100):
        if high - _RESERVED_LOW < 1_000:
            break  # no room below the ephemeral range: fall back to the kernel's choice
        port = _pick.randrange(_RESERVED_LOW, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((_HOST, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def find_binary(name: str, *, package: str) -> str:
    """``name`` on PATH or under ``/usr/lib/postgresql/*/bin`` (newest version first)."""
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        if os.access(candidate, os.X_OK):
            return candidate
    raise MissingServerBinary(
        f"{name!r} not found on PATH or in /usr/lib/postgresql/*/bin; install it with "
        f"`apt-get install -y {package}` (or run scripts/ensure_services.sh)"
    )


def _wait_until(
    probe: Any,
    *,
    timeout_s: float,
    what: str,
    proc: subprocess.Popen[bytes],
    interval_s: float = 0.02,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} while starting")
        if probe():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"{what} did not become ready within {timeout_s} s")


def _stop_process(proc: subprocess.Popen[bytes] | None, sig: int, timeout_s: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


# -- Redis -----------------------------------------------------------------------------------


@dataclass
class RedisServer:
    """A private ``redis-server``.  ``appendfsync="always"`` makes every acknowledged write
    durable (the production setting for a fault-tolerant GCS)."""

    appendonly: bool = True
    appendfsync: str = "always"
    port: int = field(default_factory=free_port)
    directory: pathlib.Path | None = None
    startup_timeout_s: float = 60.0
    """Generous: it only bounds a hang (an exit is seen at once), and redis-server has been
    seen to take seconds to answer on 2 cores running the suite at ``-n 4``."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _owns_dir: bool = field(default=False, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"redis://{_HOST}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> RedisServer:
        if self.running:
            return self
        binary = find_binary("redis-server", package="redis-server")
        if self.directory is None:
            self.directory = pathlib.Path(tempfile.mkdtemp(prefix="gcs-redis-"))
            self._owns_dir = True
        args = [
            binary,
            "--port", str(self.port),
            "--bind", _HOST,
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        _wait_until(
            self._ping, timeout_s=self.startup_timeout_s, what="redis-server", proc=self._proc
        )
        return self

    def _ping(self) -> bool:
        try:
            with socket.create_connection((_HOST, self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGTERM; ``kill=True``: SIGKILL).  Data stays for ``start()``."""
        _stop_process(self._proc, signal.SIGKILL if kill else signal.SIGTERM, 10.0)
        self._proc = None

    def cleanup(self) -> None:
        self.stop()
        if self._owns_dir and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


@contextlib.contextmanager
def redis_server(**kwargs: Any) -> Iterator[RedisServer]:
    server = RedisServer(**kwargs).start()
    try:
        yield server
    finally:
        server.cleanup()


# -- PostgreSQL ------------------------------------------------------------------------------


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
        return f"postgresql://{self.superuser}@{_HOST}:{self.port}/{database}"

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
        for attempt in range(3):
            result = subprocess.run(
                [initdb, "-D", str(self.directory / "data"), "-U", self.superuser,
                 "--auth=trust", "--encoding=UTF8", "--no-sync", "--no-instructions"],
                check=False,
                capture_output=True,
                cwd=self.directory,
                **self._run_as(),
            )  # fmt: skip
            if not _crashed_by_signal(result) or attempt == 2:
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
            "-c", f"listen_addresses={_HOST}",
            "-c", f"fsync={'on' if self.fsync else 'off'}",
            "-c", "max_connections=100",
            "-c", "shared_buffers=32MB",
        ]  # fmt: skip
        log = (self.directory / "postgres.log").open("ab")
        try:
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.directory,
                **self._run_as(),
            )  # fmt: skip
        finally:
            log.close()
        # each probe forks pg_isready: probe less often than the default on a busy machine
        _wait_until(
            self._ready,
            timeout_s=self.startup_timeout_s,
            what="postgres",
            proc=self._proc,
            interval_s=0.1,
        )
        return self

    def _ready(self) -> bool:
        isready = find_binary("pg_isready", package="postgresql")
        result = subprocess.run(
            [isready, "-h", _HOST, "-p", str(self.port), "-U", self.superuser, "-q"],
            check=False,
            capture_output=True,
        )
        return result.returncode == 0

    def stop(self, *, kill: bool = False) -> None:
        """Fast shutdown (SIGINT; ``kill=True``: SIGKILL).  Data stays for ``start()``."""
        _stop_process(self._proc, signal.SIGKILL if kill else signal.SIGINT, 30.0)
        self._proc = None

    def create_database(self, name: str) -> str:
        """Create database ``name`` (a SQL identifier) and return its URL."""
        psql = find_binary("psql", package="postgresql")
        subprocess.run(
            [psql, "-h", _HOST, "-p", str(self.port), "-U", self.superuser, "-d", "postgres",
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
