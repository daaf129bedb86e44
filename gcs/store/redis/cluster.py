"""Redis Cluster as one GCS sees it: the master of a single hash slot.

Every key of one GCS carries the hash tag ``{RAY<namespace>}`` (``gcs.store.redis``), so all
of them, and every Lua script over them, live in one slot: the store needs one master at a
time, like a standalone server, and never a cross-slot command.  What this class adds:

* **where**: ``CLUSTER SLOTS``, asked of the nodes known so far (the seed first, then every
  node any answer named), gives the master of our slot;
* **MOVED** (the slot was moved, or a failover promoted a replica that the old master now
  follows): switch to the named node for good;
* **ASK** (the slot is being migrated and the keys are already on the target): send the
  one command to the target, preceded by ``ASKING``; the slot map is left alone;
* **lost** (the master stopped answering): ask the other nodes again; until a replica is
  promoted they still name the dead master and calls fail as unavailable, after it the
  next call goes to the new master.

Ray 2.60 keeps ``RAY<namespace>@<TABLE>`` without a tag and refuses a cluster of more than
one shard (``ValidateRedisDB``); it follows MOVED to that shard's master.  A hash tag for
multi-shard clusters was proposed for Ray (ray#54701) and not merged.
"""

from __future__ import annotations

import contextlib
from typing import Any

import structlog
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.crc import key_slot

from gcs.store.redis.options import RedisOptions
from gcs.store.redis.topology import Topology, TopologyError, connection_kwargs

__all__ = ["Cluster", "tagged_prefix"]

log = structlog.get_logger("gcs.store.redis")

Address = tuple[str, int]


def tagged_prefix(namespace: str) -> bytes:
    """Key prefix in cluster mode: Ray's ``RAY<namespace>@`` with the part before ``@`` as
    hash tag.  ``RAY`` inside the braces keeps the tag non-empty for an empty namespace;
    whatever the namespace holds, every key starting with this prefix hashes alike."""
    return b"{RAY" + namespace.encode() + b"}@"


class Cluster(Topology):
    """The master serving one slot of a Redis Cluster."""

    mode = "cluster"

    def __init__(self, seed: Address, node_kwargs: dict[str, Any], options: RedisOptions) -> None:
        self._node_kwargs = {**connection_kwargs(options), **node_kwargs}
        self._known: list[Address] = [seed]
        self._clients: dict[Address, Redis] = {}
        self._slot: int | None = None
        self._master: Address = seed

    def key_prefix(self, namespace: str) -> bytes:
        return tagged_prefix(namespace)

    async def bind(self, prefix: bytes) -> None:
        """Serve the slot of keys starting with ``prefix``; find its master now."""
        self._slot = key_slot(prefix + b"x")
        if not await self._locate(exclude=None):
            raise TopologyError(
                f"no node of the Redis Cluster at {self._known[0][0]}:{self._known[0][1]} "
                f"serves slot {self._slot} (is the cluster fully set up? cluster_state:ok?)"
            )

    @property
    def slot(self) -> int:
        assert self._slot is not None, "bind() first"
        return self._slot

    @property
    def client(self) -> Redis:
        return self._node(self._master)

    @property
    def master(self) -> Address:
        return self._master

    async def redirected(self, err: redis_errors.ResponseError) -> tuple[Redis, bool] | None:
        if not isinstance(err, redis_errors.AskError):  # MovedError is an AskError too
            return None
        target = (str(err.host), int(err.port))
        self._learn([target])
        if isinstance(err, redis_errors.MovedError):
            if target != self._master:
                log.info("redis_cluster_slot_moved", slot=self._slot, master=_fmt(target))
            self._master = target
            return self.client, False
        return self._node(target), True

    async def lost(self) -> None:
        await self._locate(exclude=self._master)

    async def is_master(self, address: object) -> bool:
        # the others first: a partitioned old master still names itself
        if not await self._locate(exclude=self._master):
            return True
        return address == self._master

    async def _locate(self, *, exclude: Address | None) -> bool:
        """Ask known nodes (``exclude`` last) who serves our slot; True once found."""
        order = [a for a in self._known if a != exclude] + ([exclude] if exclude else [])
        for address in order:
            try:
                slots = await self._node(address).execute_command("CLUSTER", "SLOTS")
            except (redis_errors.RedisError, OSError):
                continue
            master = self._master_in(slots)
            if master is not None:
                if master != self._master:
                    log.info("redis_cluster_master", slot=self._slot, master=_fmt(master))
                self._master = master
                return True
        return False

    def _master_in(self, slots: Any) -> Address | None:
        found: Address | None = None
        for entry in slots:
            start, end, primary, *replicas = entry
            nodes = [primary, *replicas]
            self._learn([(_text(n[0]), int(n[1])) for n in nodes if _text(n[0])])
            if int(start) <= self.slot <= int(end) and _text(primary[0]):
                found = (_text(primary[0]), int(primary[1]))
        return found

    def _learn(self, addresses: list[Address]) -> None:
        for address in addresses:
            if address not in self._known:
                self._known.append(address)

    def _node(self, address: Address) -> Redis:
        client = self._clients.get(address)
        if client is None:
            client = Redis(host=address[0], port=address[1], **self._node_kwargs)
            self._clients[address] = client
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await client.aclose()

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "slot": self._slot, "master": _fmt(self._master)}


def _fmt(address: Address) -> str:
    return f"{address[0]}:{address[1]}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
