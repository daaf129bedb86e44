"""The GCS's two publishers, their gRPC handlers and the dead-subscriber sweep task.

Wiring in the server: a component whose ``run()`` is the sweep loop (on the injected clock)
and whose ``close()`` is :meth:`GcsPubSub.stop`; standalone::

    pubsub = GcsPubSub.create(clock)                 # or GcsPubSub(cp, obs, clock)
    server.add_generic_rpc_handlers(pubsub.handlers())
    await pubsub.start()                             # runs run() as a task
    ...
    await pubsub.stop()                              # idempotent; flushes held polls

Managers publish after persisting: ``pubsub.control_plane.publish(GCS_NODE_INFO_CHANNEL,
node_id, node_info)``; errors/logs go to ``pubsub.observability``.
"""

from __future__ import annotations

import asyncio

import grpc
import structlog
from google.protobuf.descriptor import ServiceDescriptor

from gcs.base.background import Background
from gcs.base.clock import Clock
from gcs.config import RequestLimits
from gcs.managers.pubsub.config import PublisherConfig
from gcs.managers.pubsub.publisher import Publisher
from gcs.rpc.descriptors import CONTROL_PLANE_PUBSUB, OBSERVABILITY_PUBSUB
from gcs.rpc.server import CallHook, service_handler
from gcs.services.pubsub import ObservabilityPubSubServicer, PubSubServicer

log = structlog.get_logger("gcs.managers.pubsub")


class GcsPubSub:
    """Owns the control-plane and observability publishers and their sweep loop."""

    def __init__(
        self,
        control_plane: Publisher,
        observability: Publisher,
        clock: Clock,
        *,
        sweep_interval_s: float | None = None,
    ) -> None:
        self.control_plane = control_plane
        self.observability = observability
        self._clock = clock
        self._interval_s = (
            sweep_interval_s
            if sweep_interval_s is not None
            else control_plane.config.subscriber_timeout_ms / 1000.0
        )
        self._background = Background("pubsub")
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def create(
        cls,
        clock: Clock,
        *,
        control_plane: PublisherConfig | None = None,
        observability: PublisherConfig | None = None,
        sweep_interval_s: float | None = None,
    ) -> GcsPubSub:
        """Two publishers with fresh random ids and Ray's default configs."""
        return cls(
            Publisher(control_plane or PublisherConfig.control_plane(), clock),
            Publisher(observability or PublisherConfig.observability(), clock),
            clock,
            sweep_interval_s=sweep_interval_s,
        )

    def servicers(
        self, limits: RequestLimits | None = None
    ) -> list[tuple[ServiceDescriptor, PubSubServicer]]:
        """The two services' servicers; grpc.aio and the front server (gcs.front) serve
        the same objects."""
        return [
            (CONTROL_PLANE_PUBSUB, PubSubServicer(self.control_plane, limits=limits)),
            (OBSERVABILITY_PUBSUB, ObservabilityPubSubServicer(self.observability, limits=limits)),
        ]

    def handlers(
        self,
        *,
        on_call: CallHook | None = None,
        limits: RequestLimits | None = None,
        servicers: list[tuple[ServiceDescriptor, PubSubServicer]] | None = None,
    ) -> list[grpc.GenericRpcHandler]:
        """``limits``: request bounds (the servicers' checks and the encoded-size cap)."""
        max_bytes = limits.max_request_bytes if limits is not None else None
        return [
            service_handler(descriptor, servicer, on_call=on_call, max_request_bytes=max_bytes)
            for descriptor, servicer in servicers or self.servicers(limits)
        ]

    def sweep(self) -> None:
        now = self._clock.monotonic_s()
        self.control_plane.sweep(now)
        self.observability.sweep(now)

    async def start(self) -> None:
        """Start the sweep task (no-op if running)."""
        if self._task is None or self._task.done():
            self._task = self._background.spawn(self.run(), "sweep")

    async def stop(self) -> None:
        """Stop sweeping and answer every held poll; safe to call twice or before start."""
        self._task = None
        await self._background.close()
        self.control_plane.close()
        self.observability.close()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def run(self) -> None:
        """Sweep every interval of the injected clock until cancelled."""
        while True:
            await self._clock.sleep(self._interval_s)
            try:
                self.sweep()
            except Exception:  # a sweep bug must not stop future sweeps
                log.exception("pubsub.sweep_failed")
