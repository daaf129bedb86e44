"""A private ``redis-server`` on a free port in its own directory; it can be stopped and
started again on the same port with the same data (an outage), paused (SIGSTOP) and resumed.
Nothing here touches a machine's default Redis (6379)."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gcs.testing.ports import HOST, free_port
from gcs.testing.processes import find_binary, stop_process, wait_until

__all__ = ["RedisServer", "redis_info", "redis_server"]


@dataclass
class RedisServer:
    """A private ``redis-server``.  ``appendfsync="always"`` makes every acknowledged write
    durable (the production setting for a fault-tolerant GCS)."""

    appendonly: bool = True
    appendfsync: str = "always"
    port: int = field(default_factory=free_port)
    directory: pathlib.Path | None = None
    password: str = ""
    """``requirepass`` (and ``masterauth``, for a replica of a master with the same one)."""
    extra_args: tuple[str, ...] = ()
    """More ``redis-server`` options (``--replicaof``, ``--cluster-enabled``...)."""
    startup_timeout_s: float = 60.0
    """Generous: it only bounds a hang (an exit is seen at once), and redis-server has been
    seen to take seconds to answer on 2 cores running the suite at ``-n 4``."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _owns_dir: bool = field(default=False, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

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
            "--bind", HOST,
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        # a replica's first sync starts at once, not after Redis's 5 s batching delay
        args += ["--repl-diskless-sync-delay", "0", *self.extra_args]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        wait_until(
            self._ping, timeout_s=self.startup_timeout_s, what="redis-server", proc=self._proc
        )
        return self

    @property
    def address(self) -> tuple[str, int]:
        return HOST, self.port

    def _ping(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=0.5) as sock:
                if self.password:
                    sock.sendall(_resp("AUTH", self.password))
                    if not sock.recv(64).startswith(b"+OK"):
                        return False
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def client(self) -> Any:
        """A synchronous redis-py client (for test set-up and checks, not the store)."""
        import redis

        return redis.Redis(
            host=HOST, port=self.port, password=self.password or None, socket_timeout=10
        )

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets but answers nothing until :meth:`resume`."""
        assert self._proc is not None, "not running"
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGTERM; ``kill=True``: SIGKILL).  Data stays for ``start()``."""
        self.resume()  # a paused server would not act on SIGTERM
        stop_process(self._proc, signal.SIGKILL if kill else signal.SIGTERM, 10.0)
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


def _resp(*words: str) -> bytes:
    """One command in RESP (binary-safe, unlike an inline command)."""
    out = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def redis_info(node: RedisServer, section: str, *, command: str = "") -> dict[str, str]:
    """``INFO <section>`` of a private server (or another command answering the same
    ``key:value`` lines, such as ``CLUSTER INFO``) as a dict of strings."""
    with node.client() as client:
        raw = client.execute_command(*(command or f"INFO {section}").split())
    if isinstance(raw, dict):  # redis-py parses INFO itself
        return {str(key): str(value) for key, value in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}
