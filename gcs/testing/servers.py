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
import secrets
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
    "RedisCluster",
    "RedisSentinels",
    "RedisServer",
    "find_binary",
    "free_port",
    "postgres_server",
    "redis_cluster",
    "redis_info",
    "redis_sentinels",
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


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports from :func:`free_port`, for servers started together (each
    was free a moment ago; drawn independently, two could be the same port)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


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
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        # a replica's first sync starts at once, not after Redis's 5 s batching delay
        args += ["--repl-diskless-sync-delay", "0", *self.extra_args]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        _wait_until(
            self._ping, timeout_s=self.startup_timeout_s, what="redis-server", proc=self._proc
        )
        return self

    @property
    def address(self) -> tuple[str, int]:
        return _HOST, self.port

    def _ping(self) -> bool:
        try:
            with socket.create_connection((_HOST, self.port), timeout=0.5) as sock:
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
            host=_HOST, port=self.port, password=self.password or None, socket_timeout=10
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


def _resp(*words: str) -> bytes:
    """One command in RESP (binary-safe, unlike an inline command)."""
    out = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _wait_for(probe: Any, *, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll ``probe`` until true (a real process must act: a sync, a vote, a gossip)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if probe():
                return
        time.sleep(interval_s)
    raise TimeoutError(f"{what} did not happen within {timeout_s} s")


@dataclass
class RedisSentinels:
    """A private master, its replicas and the sentinels that monitor it (``master_name``).

    Sentinel timings are short so a failover takes about a second or two:
    ``down_after_ms`` until a sentinel suspects the master, then a vote, then promotion.
    ``start()`` returns once the replicas are in sync and every sentinel knows the others
    (a failover needs a quorum of them).  ``sentinels=0``: a master and its replicas only.
    Every process is stopped by :meth:`cleanup`.
    """

    replicas: int = 1
    sentinels: int = 3
    master_name: str = "gcs-master"
    down_after_ms: int = 500
    failover_timeout_ms: int = 2000
    password: str = ""
    """``requirepass`` of every node and sentinel (and ``sentinel auth-pass``)."""
    appendfsync: str = "always"
    startup_timeout_s: float = 60.0
    nodes: list[RedisServer] = field(default_factory=list)
    """Data nodes; ``nodes[0]`` is the first master."""
    sentinel_ports: list[int] = field(default_factory=list)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    _directory: pathlib.Path | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` URL naming every sentinel and the master."""
        auth = f":{self.password}@" if self.password else ""
        hosts = ",".join(f"{_HOST}:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{auth}{hosts}/{self.master_name}/0"

    def sentinel_url(self, index: int = 0) -> str:
        """One sentinel's address as a plain ``redis://`` URL (Ray's way)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{_HOST}:{self.sentinel_ports[index]}/0"

    def start(self) -> RedisSentinels:
        self._directory = pathlib.Path(tempfile.mkdtemp(prefix="gcs-sentinels-"))
        try:
            master = RedisServer(appendfsync=self.appendfsync, password=self.password).start()
            self.nodes.append(master)
            for _ in range(self.replicas):
                replica = RedisServer(
                    appendfsync=self.appendfsync,
                    password=self.password,
                    extra_args=("--replicaof", _HOST, str(master.port)),
                ).start()
                self.nodes.append(replica)
            for replica in self.nodes[1:]:
                _wait_for(
                    lambda r=replica: (
                        redis_info(r, "replication").get("master_link_status") == "up"
                    ),
                    timeout_s=self.startup_timeout_s,
                    what="replica sync",
                )
            # Each sentinel is told the others' ids up front: found by gossip they take
            # seconds to meet, and a failover needs a quorum that knows each other.
            ports = free_ports(self.sentinels)  # two the same: that sentinel never starts
            ids = [secrets.token_hex(20) for _ in range(self.sentinels)]
            for index in range(self.sentinels):
                self._start_sentinel(index, master.port, ports, ids)
            _wait_for(self._sentinels_agree, timeout_s=self.startup_timeout_s, what="sentinels")
        except BaseException:
            self.cleanup()
            raise
        return self

    def _start_sentinel(
        self, index: int, master_port: int, ports: list[int], ids: list[str]
    ) -> None:
        assert self._directory is not None
        port = ports[index]
        home = self._directory / f"sentinel-{index}"
        home.mkdir()
        lines = [
            f"port {port}",
            f"bind {_HOST}",
            "daemonize no",
            "protected-mode no",
            f"dir {home}",
            f"logfile {home / 'sentinel.log'}",
            f"sentinel monitor {self.master_name} {_HOST} {master_port} {self.sentinels // 2 + 1}",
            f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}",
            f"sentinel failover-timeout {self.master_name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {self.master_name} 1",
            f"sentinel myid {ids[index]}",
            *(
                f"sentinel known-sentinel {self.master_name} {_HOST} {p} {i}"
                for p, i in zip(ports, ids, strict=True)
                if p != port
            ),
            *(
                f"sentinel known-replica {self.master_name} {_HOST} {r.port}"
                for r in self.nodes[1:]
            ),
        ]
        if self.password:
            lines += [f"requirepass {self.password}", f"sentinel auth-pass {self.master_name} "
                      f"{self.password}"]  # fmt: skip
        conf = home / "sentinel.conf"
        conf.write_text("\n".join(lines) + "\n")
        binary = find_binary("redis-server", package="redis-server")
        proc = subprocess.Popen([binary, str(conf), "--sentinel"], stdin=subprocess.DEVNULL)
        self._procs.append(proc)
        self.sentinel_ports.append(port)
        _wait_until(
            lambda: self._sentinel_answers(port),
            timeout_s=self.startup_timeout_s,
            what="redis sentinel",
            proc=proc,
        )

    def _sentinel_client(self, port: int) -> Any:
        import redis

        return redis.Redis(host=_HOST, port=port, password=self.password or None, socket_timeout=5)

    def pids(self) -> list[int]:
        """Every process this deployment started and still runs."""
        procs = [*self._procs, *(n._proc for n in self.nodes if n._proc is not None)]
        return [p.pid for p in procs if p.poll() is None]

    def sentinel_client(self, index: int) -> Any:
        """A synchronous redis-py client of one sentinel."""
        return self._sentinel_client(self.sentinel_ports[index])

    def stop_sentinel(self, index: int) -> None:
        """Stop one sentinel (its port stays in :attr:`url`: a dead entry of the list)."""
        _stop_process(self._procs[index], signal.SIGKILL, 10.0)

    def _sentinel_answers(self, port: int) -> bool:
        with contextlib.suppress(Exception), self._sentinel_client(port) as client:
            return bool(client.ping())
        return False

    def _sentinels_agree(self) -> bool:
        for port in self.sentinel_ports:
            with self._sentinel_client(port) as client:
                state = client.sentinel_master(self.master_name)
            if int(state["num-other-sentinels"]) < self.sentinels - 1:
                return False
            if int(state["num-slaves"]) < self.replicas:
                return False
        return True

    def master_address(self) -> tuple[str, int]:
        """Where the sentinels say the master is now."""
        for port in self.sentinel_ports:
            with contextlib.suppress(Exception), self._sentinel_client(port) as client:
                host, master_port = client.sentinel_get_master_addr_by_name(self.master_name)
                return _decoded(host), int(master_port)
        raise RuntimeError("no sentinel answers")

    def master(self) -> RedisServer:
        """The data node the sentinels name as master."""
        _, port = self.master_address()
        return next(node for node in self.nodes if node.port == port)

    def wait_for_new_master(self, old: RedisServer, *, timeout_s: float = 60.0) -> RedisServer:
        """Block until the sentinels promoted another node than ``old`` and it accepts writes."""

        def promoted() -> bool:
            _, port = self.master_address()
            if port == old.port:
                return False
            node = next(n for n in self.nodes if n.port == port)
            return redis_info(node, "replication").get("role") == "master"

        _wait_for(promoted, timeout_s=timeout_s, what="sentinel failover")
        return self.master()

    def cleanup(self) -> None:
        for proc in self._procs:
            _stop_process(proc, signal.SIGTERM, 10.0)
        self._procs.clear()
        for node in self.nodes:
            node.cleanup()
        self.nodes.clear()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


@contextlib.contextmanager
def redis_sentinels(**kwargs: Any) -> Iterator[RedisSentinels]:
    deployment = RedisSentinels(**kwargs).start()
    try:
        yield deployment
    finally:
        deployment.cleanup()


@dataclass
class RedisCluster:
    """A private Redis Cluster: ``masters`` shards with ``replicas_per_master`` each, created
    with ``redis-cli --cluster create``.  ``node_timeout_ms`` is short so a replica takes
    over a dead master in a few seconds.  :meth:`cleanup` stops every node."""

    masters: int = 3
    replicas_per_master: int = 1
    node_timeout_ms: int = 1000
    appendfsync: str = "always"
    startup_timeout_s: float = 60.0
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """A plain URL of one node (the store finds the rest)."""
        return self.nodes[0].url

    def start(self) -> RedisCluster:
        try:
            total = self.masters * (1 + self.replicas_per_master)
            for _ in range(total):
                # the bus port is a free port of its own (by default it is port + 10000,
                # which nobody checked was free)
                node = RedisServer(
                    appendfsync=self.appendfsync,
                    extra_args=(
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", str(self.node_timeout_ms),
                        "--cluster-port", str(free_port()),
                    ),
                )  # fmt: skip
                self.nodes.append(node.start())
            cli = find_binary("redis-cli", package="redis-tools")
            created = subprocess.run(
                [cli, "--cluster", "create",
                 *[f"{_HOST}:{n.port}" for n in self.nodes],
                 "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"],
                check=False,
                capture_output=True,
                timeout=self.startup_timeout_s,
            )  # fmt: skip
            if created.returncode != 0:
                tail = (created.stdout + created.stderr).decode(errors="replace")[-2000:]
                raise RuntimeError(f"redis-cli --cluster create failed:\n{tail}")
            _wait_for(self._healthy, timeout_s=self.startup_timeout_s, what="cluster_state:ok")
        except BaseException:
            self.cleanup()
            raise
        return self

    def pids(self) -> list[int]:
        """Every process this deployment started and still runs."""
        return [n._proc.pid for n in self.nodes if n._proc is not None and n.running]

    def _healthy(self) -> bool:
        for node in self.nodes:
            if not node.running:
                continue
            info = redis_info(node, "cluster", command="CLUSTER INFO")
            if info.get("cluster_state") != "ok":
                return False
        return True

    def wait_healthy(self, *, timeout_s: float = 60.0) -> None:
        """Block until every running node reports ``cluster_state:ok`` again."""
        _wait_for(self._healthy, timeout_s=timeout_s, what="cluster_state:ok")

    def master_of(self, slot: int) -> RedisServer:
        """The running node serving ``slot`` as master, as the cluster says now."""
        for node in self.nodes:
            if not node.running:
                continue
            with node.client() as client:
                for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(primary[1])
                        return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no running node serves slot {slot}")

    def node_id(self, node: RedisServer) -> str:
        with node.client() as client:
            return str(client.execute_command("CLUSTER", "MYID").decode())

    def start_migration(self, slot: int, target: RedisServer) -> RedisServer:
        """Mark ``slot`` as moving from its master to ``target`` (IMPORTING / MIGRATING) and
        move every key; the source still owns the slot (it answers ASK).  Returns it."""
        source = self.master_of(slot)
        source_id, target_id = self.node_id(source), self.node_id(target)
        with target.client() as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        with source.client() as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                client.execute_command("MIGRATE", _HOST, target.port, "", 0, 5000, "KEYS", *keys)
        return source

    def finish_migration(self, slot: int, target: RedisServer) -> None:
        """Give ``slot`` to ``target`` on every master (the source now answers MOVED)."""
        target_id = self.node_id(target)
        masters = [
            n
            for n in self.nodes
            if n.running and redis_info(n, "replication").get("role") == "master"
        ]
        for node in sorted(masters, key=lambda n: n is not target):  # the target first
            with node.client() as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def wait_for_new_master(
        self, slot: int, old: RedisServer, *, timeout_s: float = 60.0
    ) -> RedisServer:
        """Block until a node other than ``old`` serves ``slot`` and the cluster is ok."""

        def promoted() -> bool:
            return self.master_of(slot).port != old.port and self._healthy()

        _wait_for(promoted, timeout_s=timeout_s, what="cluster failover")
        return self.master_of(slot)

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
        self.nodes.clear()


@contextlib.contextmanager
def redis_cluster(**kwargs: Any) -> Iterator[RedisCluster]:
    deployment = RedisCluster(**kwargs).start()
    try:
        yield deployment
    finally:
        deployment.cleanup()


def _decoded(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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


# -- PostgreSQL ------------------------------------------------------------------------------


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
            "-c", f"listen_addresses={_HOST}",
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
                _wait_until(
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
