"""Raylet clients, at most ``max_open`` at once, the least recently used idle one closed first.

A :class:`RayletClient` holds the two connections a raylet may need: the lean HTTP/2
connection (background calls: load polls, health checks, restart notifications) and a
grpc.aio channel (drain / resize, and raylets the lean client cannot talk to).  Both connect
lazily, on first use, so a raylet never drained costs one socket.  Callers
:meth:`RayletClientPool.lease` a client for the duration of one call and
:meth:`~RayletClientPool.release` it; a leased
client is never evicted, so the number of clients can only exceed ``max_open`` while more
calls than that are in flight (the gateway keeps its in-flight bound below it).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import grpc
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2

from gcs.base.background import Background
from gcs.base.clock import SYSTEM_CLOCK, Clock
from gcs.base.errors import RayletUnreachable
from gcs.rpc.descriptors import NODE_MANAGER
from gcs.rpc.method_paths import method_path
from gcs.rpc.raylet_io.errors import raylet_error
from gcs.rpc.raylet_io.h2_unary import H2UnaryClient
from gcs.rpc.security import NO_SECURITY, Security

GET_RESOURCE_LOAD_PATH = "/ray.rpc.NodeManagerService/GetResourceLoad"
HEALTH_CHECK = "HealthCheck"
HEALTH_CHECK_PATH = "/grpc.health.v1.Health/Check"


def _methods() -> dict[str, tuple[str, type[Message]]]:
    """Method name -> (path, reply class): NodeManagerService's unary methods and Check."""
    out: dict[str, tuple[str, type[Message]]] = {
        m.name: (method_path(m), GetMessageClass(m.output_type))
        for m in NODE_MANAGER.methods
        if not (m.client_streaming or m.server_streaming)
    }
    out[HEALTH_CHECK] = (HEALTH_CHECK_PATH, health_pb2.HealthCheckResponse)
    return out


METHODS = _methods()


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 512 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 10000),
    ("grpc.keepalive_timeout_ms", 20000),
    # Fail fast when a raylet is gone instead of queueing calls behind reconnect backoff.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class RayletClient:
    """One raylet's connections; multicallables are made per method on first use (a full
    stub of NodeManagerService costs ~0.5 ms, which matters when 50,000 raylets churn)."""

    __slots__ = (
        "_calls",
        "_channel",
        "_clock",
        "_h2_load",
        "_security",
        "address",
        "closed",
        "leases",
    )

    def __init__(
        self, address: str, security: Security = NO_SECURITY, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.address = address
        self._security = security
        self._clock = clock
        self.leases = 0
        self.closed = False
        """Set when the pool let go of this client (evicted, replaced, its node forgotten):
        calls still in flight on it are being cut."""
        self._channel: grpc.aio.Channel | None = None
        self._calls: dict[str, Any] = {}
        self._h2_load: H2UnaryClient | None = None

    def grpc_call(self, method: str) -> Any:
        """The grpc.aio multicallable for a NodeManagerService method or ``HEALTH_CHECK``."""
        call = self._calls.get(method)
        if call is None:
            if self._channel is None:
                # the token and TLS in force, as Ray's GCS sends them to raylets
                self._channel = self._security.aio_channel(self.address, options=CHANNEL_OPTIONS)
            path, reply_cls = METHODS[method]
            call = self._calls[method] = self._channel.unary_unary(
                path,
                request_serializer=_serialize,
                response_deserializer=reply_cls.FromString,
                _registered_method=True,
            )
        return call

    def h2(self) -> H2UnaryClient:
        """Lean HTTP/2 client (own connection, made on first use); its default path is
        GetResourceLoad, other calls name theirs."""
        if self._h2_load is None:
            token = self._security.token
            self._h2_load = H2UnaryClient(
                self.address,
                GET_RESOURCE_LOAD_PATH,
                authorization=token.header_value if token is not None else "",
                clock=self._clock,
            )
        return self._h2_load

    @property
    def has_channel(self) -> bool:
        return self._channel is not None

    def close_h2(self) -> None:
        if self._h2_load is not None:
            self._h2_load.close()
            self._h2_load = None

    async def close(self) -> None:
        self.closed = True
        self.close_h2()
        channel, self._channel = self._channel, None
        self._calls = {}
        if channel is not None:
            await channel.close(grace=None)


class RayletClientPool:
    def __init__(
        self, max_open: int, security: Security = NO_SECURITY, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._security = security
        self._clock = clock
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.max_open = max_open
        self._clients: OrderedDict[bytes, RayletClient] = OrderedDict()
        self._closing = Background("raylet_pool")
        """Evicted clients' channels, closing."""
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
            client = clients[node_id] = RayletClient(address, self._security, self._clock)
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
        client.closed = True
        client.close_h2()  # frees its socket now, not when a task runs
        if not client.has_channel:
            return
        self._closing.spawn(client.close(), "close-client")

    async def close(self) -> None:
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            await client.close()
        await self._closing.settle()


async def grpc_unary(
    client: RayletClient,
    node_id: bytes,
    method: str,
    request: Message,
    timeout_s: float | None,
) -> Message:
    """One grpc.aio call of ``method`` on ``client``; every failure leaves as a domain error
    (:func:`~gcs.rpc.raylet_io.errors.raylet_error`).

    Closing a channel cancels the calls in flight on it: grpc.aio raises ``CancelledError``
    in the caller although nobody cancelled the caller.  Let through, that looks like a
    cancelled RPC handler, which then never answers its own client (DrainNode waited for
    the caller's 90 s deadline when the node unregistered mid-drain).  So a call cut by the
    pool letting go of its client (node forgotten, client replaced) is ``RayletUnreachable``;
    a real cancellation of the caller still propagates."""
    try:
        reply: Message = await client.grpc_call(method)(request, timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        raise raylet_error(node_id, method, err) from err
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if client.closed and (task is None or not task.cancelling()):
            raise RayletUnreachable(
                node_id,
                f"raylet {node_id.hex()} {method}: connection closed while the call was in "
                "flight (the node was forgotten)",
            ) from None
        raise
    return reply


async def direct_call(
    pool: RayletClientPool,
    node_id: bytes,
    address: str,
    method: str,
    request: Message,
    timeout_s: float | None,
) -> Message:
    """One grpc call of a NodeManagerService method on a pooled client, outside any queue;
    transport failures leave as domain errors (:func:`grpc_unary`)."""
    client = pool.lease(node_id, address)
    try:
        return await grpc_unary(client, node_id, method, request, timeout_s)
    finally:
        pool.release(client)
