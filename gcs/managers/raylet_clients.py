"""One gRPC channel per alive raylet, shared by the poller, health checks and forwarding."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2_grpc

from gcs.managers.h2_unary import H2UnaryClient
from gcs.rpc import ServiceStub
from gcs.rpc.security import NO_SECURITY, Security
from gcs.rpc.services import NODE_MANAGER

GET_RESOURCE_LOAD_PATH = "/ray.rpc.NodeManagerService/GetResourceLoad"

_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 512 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 10000),
    ("grpc.keepalive_timeout_ms", 20000),
    # Fail fast when a raylet is gone instead of queueing calls behind reconnect backoff.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class RayletClient:
    __slots__ = ("_authorization", "_h2_load", "address", "channel", "health", "node_manager")

    def __init__(self, address: str, security: Security = NO_SECURITY) -> None:
        self.address = address
        self.channel = security.aio_channel(address, options=_CHANNEL_OPTIONS)
        self._authorization = security.token.header_value if security.token else ""
        self.node_manager = ServiceStub(self.channel, NODE_MANAGER, timeout_s=30.0)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self._h2_load: H2UnaryClient | None = None

    def h2_load(self) -> H2UnaryClient:
        """Lean HTTP/2 client for GetResourceLoad (own connection, created on first use)."""
        if self._h2_load is None:
            self._h2_load = H2UnaryClient(
                self.address, GET_RESOURCE_LOAD_PATH, authorization=self._authorization
            )
        return self._h2_load

    def close_h2(self) -> None:
        if self._h2_load is not None:
            self._h2_load.close()
            self._h2_load = None


class RayletClientPool:
    """GCS -> raylet channels carry the token and TLS in force, as Ray's GCS does."""

    def __init__(self, security: Security = NO_SECURITY) -> None:
        self._security = security
        self._clients: dict[bytes, RayletClient] = {}

    def get(self, node_id: bytes, address: str) -> RayletClient:
        client = self._clients.get(node_id)
        if client is None or client.address != address:
            if client is not None:
                _close_soon(client)
            client = RayletClient(address, self._security)
            self._clients[node_id] = client
        return client

    def drop(self, node_id: bytes) -> None:
        client = self._clients.pop(node_id, None)
        if client is not None:
            _close_soon(client)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close_h2()
            await client.channel.close(grace=None)


def _close_soon(client: RayletClient) -> None:

    client.close_h2()
    asyncio.get_running_loop().create_task(client.channel.close(grace=None))
