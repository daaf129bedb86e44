"""GCS -> raylet health checks (``grpc.health.v1``), Ray's period / timeout / threshold.

One loop for all nodes instead of a timer per node: every tick it starts the checks that
are due, bounded by a semaphore, so 2,000 nodes cost 2,000 small RPCs per period and a
hung raylet only holds its own slot until its deadline.  A check passes iff the RPC is OK and
SERVING; each failure takes one from the node's budget; at zero the node is failed.

Death goes through :meth:`NodeManager.fail_unhealthy`, on the node manager's lane: a node
that unregistered or was drained meanwhile is a no-op there, never a second death.  The
checker hears node events through the :class:`~gcs.managers.events.NodeEvents` it is given.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health_pb2

from gcs.clock import Clock
from gcs.config import HealthCheckConfig
from gcs.managers.events import NodeEvents
from gcs.managers.nodes import NodeManager
from gcs.managers.raylet_clients import RayletClientPool
from gcs.proto import gcs_pb2

log = structlog.get_logger("gcs.health")


@dataclass(slots=True)
class _NodeHealth:
    address: str
    next_check_s: float
    failures_left: int
    in_flight: bool = False
    last_healthy_s: float = 0.0


class HealthChecker:
    def __init__(
        self,
        nodes: NodeManager,
        clients: RayletClientPool,
        clock: Clock,
        config: HealthCheckConfig,
        *,
        node_events: NodeEvents,
    ) -> None:
        self._nodes = nodes
        self._clients = clients
        self._clock = clock
        self._config = config
        self._state: dict[bytes, _NodeHealth] = {}
        self._sem = asyncio.Semaphore(config.max_concurrent)
        self._tasks: set[asyncio.Task[None]] = set()
        self.checks = 0
        self.failures = 0
        node_events.subscribe(self)

    # NodeListener
    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        address = f"{node.node_manager_address}:{node.node_manager_port}"
        self._state[node.node_id] = _NodeHealth(
            address=address,
            next_check_s=self._clock.monotonic_s() + self._config.initial_delay_ms / 1000,
            failures_left=self._config.failure_threshold,
        )

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        self._state.pop(node.node_id, None)

    def mark_healthy(self, node_id: bytes) -> None:
        """Any fresh report from the raylet (e.g. a load poll) counts as a heartbeat."""
        state = self._state.get(node_id)
        if state is not None:
            state.last_healthy_s = self._clock.monotonic_s()

    def tick(self) -> int:
        """Start every due check; returns how many were started."""
        now = self._clock.monotonic_s()
        period_s = self._config.period_ms / 1000
        started = 0
        for node_id, state in self._state.items():
            if state.in_flight or state.next_check_s > now:
                continue
            state.next_check_s = now + period_s
            if now - state.last_healthy_s < period_s:
                state.failures_left = self._config.failure_threshold
                continue  # Ray skips the RPC when the node proved alive within a period
            state.in_flight = True
            task = asyncio.get_running_loop().create_task(self._check(node_id, state))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started += 1
        return started

    async def _check(self, node_id: bytes, state: _NodeHealth) -> None:
        ok = False
        try:
            async with self._sem:
                client = self._clients.get(node_id, state.address)
                reply = await client.health.Check(
                    health_pb2.HealthCheckRequest(service=node_id.hex()),
                    timeout=self._config.timeout_ms / 1000,
                )
                ok = reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.aio.AioRpcError:
            ok = False
        finally:
            state.in_flight = False
        self.checks += 1
        if node_id not in self._state:
            return
        if ok:
            state.failures_left = self._config.failure_threshold
            return
        self.failures += 1
        state.failures_left -= 1
        log.debug("health.failed", node_id=node_id.hex(), left=state.failures_left)
        if state.failures_left <= 0:
            self._state.pop(node_id, None)
            try:
                await self._nodes.fail_unhealthy(node_id)
            except Exception:
                log.exception("health.mark_dead_failed", node_id=node_id.hex())
                # put it back so the next tick retries the (persisted) death
                state.failures_left = 0
                self._state[node_id] = state

    async def run(self, tick_s: float = 0.2) -> None:
        while True:
            self.tick()
            await asyncio.sleep(tick_s)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
