"""The network :class:`~gcs.rpc.raylet_io.gateway.RayletGateway`: gRPC plus the lean HTTP/2 client.

* Bounded: at most ``max_in_flight`` background calls (polls, health checks, restart
  notifications, ``ReleaseUnusedBundles`` after a restart) at once, at most
  ``max_calls_per_s`` started per second (less while the event loop lags:
  :class:`~gcs.rpc.raylet_io.rate.LagGovernor`), and at most ``max_open_clients`` raylet
  clients open (least recently used idle ones are closed).  A call's deadline starts when
  it gets its slot.  DrainRaylet / Resize and the bundle calls of a placement (prepare /
  commit / remove) answer a user and skip the queue (they still use the pool).
* Transport choice: background calls and bundle calls (prepare / commit / remove / release
  unused) go over :mod:`gcs.rpc.raylet_io.h2_unary` when the poll transport is ``h2`` (no grpc
  channel is created for them: grpc.aio channel set-up and failing connects cost ~0.5 ms
  each and, by the thousand, stall the GCS's own server; a grpc.aio unary call costs
  ~0.3-0.5 ms of CPU); a raylet the lean client cannot talk to (a protocol error, an
  unimplemented path, an oversized reply) is called with grpc.aio from then on.
* Errors leave as domain errors (:mod:`gcs.rpc.raylet_io.errors`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import grpc
import structlog
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health_pb2

from gcs.base.background import Background
from gcs.base.clock import SYSTEM_CLOCK, Clock
from gcs.proto import common_pb2, gcs_pb2, node_manager_pb2
from gcs.rpc.raylet_io.budget import RayletIoBudget
from gcs.rpc.raylet_io.errors import raylet_error
from gcs.rpc.raylet_io.h2_grpc import H2CallError
from gcs.rpc.raylet_io.pool import (
    HEALTH_CHECK,
    METHODS,
    RayletClient,
    RayletClientPool,
    direct_call,
    grpc_unary,
)
from gcs.rpc.raylet_io.rate import LagGovernor, RateLimiter
from gcs.rpc.security import NO_SECURITY, Security

log = structlog.get_logger("gcs.raylets")

H2_FALLBACK_CODES = frozenset(
    {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)
_CONTROL_FALLBACK_CODES = H2_FALLBACK_CODES - {grpc.StatusCode.UNIMPLEMENTED}
"""A bundle method a raylet does not implement says nothing about the lean client: its
polls stay on HTTP/2."""
_LOAD_REQUEST = node_manager_pb2.GetResourceLoadRequest()
_NOTIFY_REQUEST = node_manager_pb2.NotifyGCSRestartRequest()
_SERVING = health_pb2.HealthCheckResponse.SERVING
_H2_PATH: dict[str, str | None] = {"GetResourceLoad": None}
"""None: the HTTP/2 client's own (pre-encoded) path."""


class GrpcRayletGateway:
    def __init__(
        self,
        budget: RayletIoBudget,
        *,
        poll_transport: str = "h2",
        security: Security = NO_SECURITY,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``clock``: the rate limit's waits, the HTTP/2 calls' deadlines and timers run on
        it (the lag governor alone measures wall time)."""
        if poll_transport not in ("grpc", "h2"):
            raise ValueError(f"poll transport must be 'grpc' or 'h2', not {poll_transport!r}")
        self.budget = budget
        self.pool = RayletClientPool(budget.max_open_clients, security, clock)
        self._clock = clock
        self._tasks = Background("raylets")
        self._slots = asyncio.Semaphore(budget.max_in_flight)
        self._rate: RateLimiter | None = None
        self._governor: LagGovernor | None = None
        self._governor_task: asyncio.Task[None] | None = None
        if budget.max_calls_per_s > 0:
            rate = budget.max_calls_per_s
            self._rate = RateLimiter(rate, rate, clock)
            self._governor = LagGovernor(self._rate, max_rate=rate, min_rate=rate / 4)
        self._h2 = poll_transport == "h2"
        self.grpc_only: set[bytes] = set()
        """Nodes whose raylet the lean HTTP/2 client could not talk to: polled with grpc."""
        self.in_flight = 0
        self.max_in_flight_seen = 0

    # ------------------------------------------------------------------ RayletGateway

    async def get_resource_load(
        self, node_id: bytes, address: str, timeout_s: float
    ) -> gcs_pb2.ResourcesData:
        reply = await self._background(
            node_id, address, "GetResourceLoad", _LOAD_REQUEST, b"", timeout_s
        )
        return reply.resources  # type: ignore[attr-defined,no-any-return]

    async def health_check(self, node_id: bytes, address: str, timeout_s: float) -> bool:
        request = health_pb2.HealthCheckRequest(service=node_id.hex())
        reply = await self._background(
            node_id, address, HEALTH_CHECK, request, request.SerializeToString(), timeout_s
        )
        return bool(reply.status == _SERVING)  # type: ignore[attr-defined]

    async def notify_gcs_restart(self, node_id: bytes, address: str, timeout_s: float) -> None:
        await self._background(
            node_id, address, "NotifyGCSRestart", _NOTIFY_REQUEST, b"", timeout_s
        )

    async def drain(
        self,
        node_id: bytes,
        address: str,
        request: node_manager_pb2.DrainRayletRequest,
        timeout_s: float,
    ) -> node_manager_pb2.DrainRayletReply:
        reply = await direct_call(self.pool, node_id, address, "DrainRaylet", request, timeout_s)
        return reply  # type: ignore[return-value]

    async def resize(
        self, node_id: bytes, address: str, resources: Mapping[str, float], timeout_s: float
    ) -> dict[str, float]:
        reply = await direct_call(
            self.pool,
            node_id,
            address,
            "ResizeLocalResourceInstances",
            node_manager_pb2.ResizeLocalResourceInstancesRequest(resources=resources),
            timeout_s,
        )
        return dict(reply.total_resources)  # type: ignore[attr-defined]

    async def prepare_bundles(
        self, node_id: bytes, address: str, bundles: Sequence[common_pb2.Bundle], timeout_s: float
    ) -> bool:
        request = node_manager_pb2.PrepareBundleResourcesRequest(bundle_specs=bundles)
        reply = await self._direct(node_id, address, "PrepareBundleResources", request, timeout_s)
        return bool(reply.success)  # type: ignore[attr-defined]

    async def commit_bundles(
        self, node_id: bytes, address: str, bundles: Sequence[common_pb2.Bundle], timeout_s: float
    ) -> None:
        request = node_manager_pb2.CommitBundleResourcesRequest(bundle_specs=bundles)
        await self._direct(node_id, address, "CommitBundleResources", request, timeout_s)

    async def remove_bundles(
        self,
        node_id: bytes,
        address: str,
        pg_id: bytes,
        bundles: Sequence[common_pb2.Bundle],
        timeout_s: float,
    ) -> None:
        request = node_manager_pb2.RemovePlacementGroupBundlesRequest(
            placement_group_id=pg_id, bundle_specs=bundles
        )
        await self._direct(node_id, address, "RemovePlacementGroupBundles", request, timeout_s)

    async def release_unused_bundles(
        self,
        node_id: bytes,
        address: str,
        in_use: Sequence[common_pb2.Bundle],
        timeout_s: float,
    ) -> None:
        # Sent to every raylet after a restart: bounded like NotifyGCSRestart.
        request = node_manager_pb2.ReleaseUnusedBundlesRequest(bundles_in_use=in_use)
        await self._background(
            node_id,
            address,
            "ReleaseUnusedBundles",
            request,
            request.SerializeToString(),
            timeout_s,
            fall_back_on=_CONTROL_FALLBACK_CODES,
        )

    def forget(self, node_id: bytes) -> None:
        self.pool.drop(node_id)
        self.grpc_only.discard(node_id)

    @property
    def calls_per_s(self) -> float:
        """The rate background calls may start at now (0 = unlimited)."""
        return self._rate.rate if self._rate is not None else 0.0

    async def close(self) -> None:
        await self._tasks.close()  # the lag governor
        self._governor_task = None
        await self.pool.close()

    # ------------------------------------------------------------------ internals

    @property
    def lean(self) -> bool:
        """Calls go over the lean HTTP/2 client (no TLS), grpc only for a node that fell
        back."""
        return self._h2

    async def control_call(
        self, node_id: bytes, address: str, method: str, request: Message, timeout_s: float | None
    ) -> Message:
        """A NodeManagerService call for another component (the actor scheduler's leases
        and kills): :meth:`_direct`."""
        return await self._direct(node_id, address, method, request, timeout_s)

    async def _direct(
        self, node_id: bytes, address: str, method: str, request: Message, timeout_s: float | None
    ) -> Message:
        """A control call (bundles, actor leases): outside the background queue and rate
        (like drain), over the same transport as background calls (None: no deadline)."""
        client = self.pool.lease(node_id, address)
        try:
            return await self._call(
                client, node_id, method, request, None, timeout_s, _CONTROL_FALLBACK_CODES
            )
        finally:
            self.pool.release(client)

    async def _background(
        self,
        node_id: bytes,
        address: str,
        method: str,
        request: Message,
        request_bytes: bytes,
        timeout_s: float,
        *,
        fall_back_on: frozenset[grpc.StatusCode] = H2_FALLBACK_CODES,
    ) -> Message:
        """A poll, health check, notification or restart fan-out: in a slot, within the
        rate."""
        async with self._slots:
            await self._enter()
            client = self.pool.lease(node_id, address)
            try:
                return await self._call(
                    client, node_id, method, request, request_bytes, timeout_s, fall_back_on
                )
            finally:
                self.pool.release(client)
                self.in_flight -= 1

    async def _call(
        self,
        client: RayletClient,
        node_id: bytes,
        method: str,
        request: Message,
        request_bytes: bytes | None,
        timeout_s: float | None,
        fall_back_on: frozenset[grpc.StatusCode],
    ) -> Message:
        """Over HTTP/2 unless the node fell back to grpc (or the transport is grpc);
        ``request_bytes`` None: serialized here; an HTTP/2 failure with a code in
        ``fall_back_on`` makes the node's later calls use grpc."""
        try:
            if self._h2 and node_id not in self.grpc_only:
                path, reply_cls = METHODS[method]
                if request_bytes is None:
                    request_bytes = request.SerializeToString()
                raw = await client.h2().call(request_bytes, timeout_s, _H2_PATH.get(method, path))
                try:
                    return reply_cls.FromString(raw)
                except DecodeError:
                    raise H2CallError(grpc.StatusCode.INTERNAL, "undecodable reply") from None
            return await grpc_unary(client, node_id, method, request, timeout_s)
        except H2CallError as err:
            if err.code() in fall_back_on:
                self._fall_back(node_id, err)
            raise raylet_error(node_id, method, err) from None

    async def _enter(self) -> None:
        """Inside a slot: wait for the rate limit, then count the call as in flight."""
        if self._rate is not None:
            if self._governor_task is None and self._governor is not None:
                # started by the first call (the gateway has no run()), closed with it
                self._governor_task = self._tasks.start(self._governor.run(), "rate-governor")
            wait_s = self._rate.reserve()
            if wait_s > 0:
                await self._clock.sleep(wait_s)
        self.in_flight += 1
        self.max_in_flight_seen = max(self.max_in_flight_seen, self.in_flight)

    def _fall_back(self, node_id: bytes, err: H2CallError) -> None:
        """The peer speaks something our lean client does not: use grpc from now on."""
        self.grpc_only.add(node_id)
        log.warning(
            "raylet.h2_fallback", node_id=node_id.hex(), code=err.code().name, details=err.details
        )
