"""Raylet clients, at most ``max_open`` at once, the least recently used idle one closed first.

A :class:`RayletClient` holds the two connections a raylet may need: the lean HTTP/2
connection (hot unary calls such as GetResourceLoad) and a grpc.aio channel (everything else,
and raylets the lean client cannot talk to).  Both connect lazily, on first use, so a client
costs one socket at most for a raylet only ever polled.  Callers :meth:`RayletClientPool.lease`
a client for the duration of one call and :meth:`~RayletClientPool.release` it; a leased
client is never evicted, so the number of clients can only exceed ``max_open`` while more
calls than that are in flight (the gateway keeps its in-flight bound below it).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import grpc
from grpc_health.v1 import health_pb2_grpc

from gcs.rpc.client import ServiceStub
from gcs.rpc.raylets.h2_unary import H2UnaryClient
from gcs.rpc.services import NODE_MANAGER

GET_RESOURCE_LOAD_PATH = "/ray.rpc.NodeManagerService/GetResourceLoad"

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 512 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 10000),
    ("grpc.keepalive_timeout_ms", 20000),
    # Fail fast when a raylet is gone instead of queueing calls behind reconnect backoff.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class RayletClient:
    __slots__ = ("_channel", "_h2_load", "_health", "_node_manager", "address", "leases")

    def __init__(self, address: str) -> None:
        self.address = address
        self.leases = 0
        self._channel: grpc.aio.Channel | None = None
        self._node_manager: ServiceStub | None = None
        self._health: health_pb2_grpc.HealthStub | None = None
        self._h2_load: H2UnaryClient | None = None

    def _open_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        return self._channel

    @property
    def node_manager(self) -> ServiceStub:
        if self._node_manager is None:
            self._node_manager = ServiceStub(self._open_channel(), NODE_MANAGER, timeout_s=30.0)
        return self._node_manager

    @property
    def health(self) -> health_pb2_grpc.HealthStub:
        if self._health is None:
            self._health = health_pb2_grpc.HealthStub(self._open_channel())
        return self._health

    def h2_load(self) -> H2UnaryClient:
        """Lean HTTP/2 client for GetResourceLoad (own connection, created on first use)."""
        if self._h2_load is None:
            self._h2_load = H2UnaryClient(self.address, GET_RESOURCE_LOAD_PATH)
        return self._h2_load

    @property
    def has_channel(self) -> bool:
        return self._channel is not None

    def close_h2(self) -> None:
        if self._h2_load is not None:
            self._h2_load.close()
            self._h2_load = None

    async def close(self) -> None:
        self.close_h2()
        channel, self._channel = self._channel, None
        self._node_manager = self._health = None
        if channel is not None:
            await channel.close(grace=None)


class RayletClientPool:
    def __init__(self, max_open: int) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.max_open = max_open
        self._clients: OrderedDict[bytes, RayletClient] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._clients)

    def lease(self, node_id: bytes, address: str) -> RayletClient:
        """The node's client (opened or replaced as needed), held until :meth:`release`."""
        clients = self._clients
        client = clients.get(node_id)
        if client is not None and client.address == address:
            clients.move_to_end(node_id)
        else:
            if client is not None:
                del clients[node_id]
                self._close_soon(client)
            else:
                self._evict_idle()
            client = clients[node_id] = RayletClient(address)
        client.leases += 1
        return client

    def release(self, client: RayletClient) -> None:
        client.leases -= 1

    def drop(self, node_id: bytes) -> None:
        client = self._clients.pop(node_id, None)
        if client is not None:
            self._close_soon(client)

    def _evict_idle(self) -> None:
        """Make room for one more client by closing the least recently used idle ones."""
        clients = self._clients
        if len(clients) < self.max_open:
            return
        for node_id, client in clients.items():  # oldest first
            if client.leases == 0:
                del clients[node_id]
                self._close_soon(client)
                self.evictions += 1
                return

    def _close_soon(self, client: RayletClient) -> None:
        client.close_h2()  # frees its socket now, not when a task runs
        if not client.has_channel:
            return
        task = asyncio.get_running_loop().create_task(client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            await client.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
