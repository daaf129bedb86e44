"""A private Redis master, its replicas and the sentinels that monitor it."""

from __future__ import annotations

import contextlib
import pathlib
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gcs.testing.ports import HOST, free_ports
from gcs.testing.processes import find_binary, stop_process, wait_for, wait_until
from gcs.testing.redis_server import RedisServer, redis_info

__all__ = ["RedisSentinels", "redis_sentinels"]


def _decoded(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        hosts = ",".join(f"{HOST}:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{auth}{hosts}/{self.master_name}/0"

    def sentinel_url(self, index: int = 0) -> str:
        """One sentinel's address as a plain ``redis://`` URL (Ray's way)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.sentinel_ports[index]}/0"

    def start(self) -> RedisSentinels:
        self._directory = pathlib.Path(tempfile.mkdtemp(prefix="gcs-sentinels-"))
        try:
            master = RedisServer(appendfsync=self.appendfsync, password=self.password).start()
            self.nodes.append(master)
            for _ in range(self.replicas):
                replica = RedisServer(
                    appendfsync=self.appendfsync,
                    password=self.password,
                    extra_args=("--replicaof", HOST, str(master.port)),
                ).start()
                self.nodes.append(replica)
            for replica in self.nodes[1:]:
                wait_for(
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
            wait_for(self._sentinels_agree, timeout_s=self.startup_timeout_s, what="sentinels")
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
            f"bind {HOST}",
            "daemonize no",
            "protected-mode no",
            f"dir {home}",
            f"logfile {home / 'sentinel.log'}",
            f"sentinel monitor {self.master_name} {HOST} {master_port} {self.sentinels // 2 + 1}",
            f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}",
            f"sentinel failover-timeout {self.master_name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {self.master_name} 1",
            f"sentinel myid {ids[index]}",
            *(
                f"sentinel known-sentinel {self.master_name} {HOST} {p} {i}"
                for p, i in zip(ports, ids, strict=True)
                if p != port
            ),
            *(f"sentinel known-replica {self.master_name} {HOST} {r.port}" for r in self.nodes[1:]),
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
        wait_until(
            lambda: self._sentinel_answers(port),
            timeout_s=self.startup_timeout_s,
            what="redis sentinel",
            proc=proc,
        )

    def _sentinel_client(self, port: int) -> Any:
        import redis

        return redis.Redis(host=HOST, port=port, password=self.password or None, socket_timeout=5)

    def pids(self) -> list[int]:
        """Every process this deployment started and still runs."""
        procs = [*self._procs, *(n._proc for n in self.nodes if n._proc is not None)]
        return [p.pid for p in procs if p.poll() is None]

    def sentinel_client(self, index: int) -> Any:
        """A synchronous redis-py client of one sentinel."""
        return self._sentinel_client(self.sentinel_ports[index])

    def stop_sentinel(self, index: int) -> None:
        """Stop one sentinel (its port stays in :attr:`url`: a dead entry of the list)."""
        stop_process(self._procs[index], signal.SIGKILL, 10.0)

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

        wait_for(promoted, timeout_s=timeout_s, what="sentinel failover")
        return self.master()

    def cleanup(self) -> None:
        for proc in self._procs:
            stop_process(proc, signal.SIGTERM, 10.0)
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
