"""A private Redis Cluster (``redis-cli --cluster create``) with slot migration and failover
helpers."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gcs.testing.ports import HOST, free_port
from gcs.testing.processes import find_binary, wait_for
from gcs.testing.redis_server import RedisServer, redis_info

__all__ = ["RedisCluster", "redis_cluster"]


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
                 *[f"{HOST}:{n.port}" for n in self.nodes],
                 "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"],
                check=False,
                capture_output=True,
                timeout=self.startup_timeout_s,
            )  # fmt: skip
            if created.returncode != 0:
                tail = (created.stdout + created.stderr).decode(errors="replace")[-2000:]
                raise RuntimeError(f"redis-cli --cluster create failed:\n{tail}")
            wait_for(self._healthy, timeout_s=self.startup_timeout_s, what="cluster_state:ok")
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
        wait_for(self._healthy, timeout_s=timeout_s, what="cluster_state:ok")

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
                client.execute_command("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *keys)
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

        wait_for(promoted, timeout_s=timeout_s, what="cluster failover")
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
