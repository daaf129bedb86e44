"""GCS -> raylet health checks (``grpc.health.v1``), Ray's period / timeout / threshold.

One loop for all nodes instead of a timer per node: due times sit in a heap, and every tick
starts the checks that are due while fewer than ``max_concurrent`` are in flight (a check
waiting for its turn is not a task and not a failure), so 50,000 nodes cost no more than the
checks actually running.  First checks are spread over one period after the initial delay
(jitter): nodes loaded together after a restart are not all checked - or failed - at once
(evenly, each drawn and queued as its time comes: 10,000 loaded nodes cost no heap before
the GCS serves).  A check passes iff the raylet answers SERVING; each failure of a check
actually made takes one from the node's budget; at zero the node is failed.

Death goes through :meth:`NodeManager.fail_unhealthy`, on the node manager's lane: a node
that unregistered or was drained meanwhile is a no-op there, never a second death.  The
checker is a node listener (subscribed by the wiring); its loop ticks on the injected clock.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import structlog

from gcs.base.background import Background
from gcs.base.clock import Clock
from gcs.base.errors import GcsError
from gcs.config import HealthCheckConfig
from gcs.managers.events import Prepared
from gcs.managers.nodes import NodeManager
from gcs.managers.startup_spread import spread_lazily
from gcs.proto import gcs_pb2
from gcs.rpc.raylet_io.gateway import RayletGateway, raylet_address

log = structlog.get_logger("gcs.health")


@dataclass(slots=True)
class _NodeHealth:
    address: str
    next_check_s: float
    failures_left: int
    in_flight: bool = False
    last_healthy_s: float = float("-inf")


def node_health(node: gcs_pb2.GcsNodeInfo) -> _NodeHealth:
    """A node's record before its first check is scheduled (the checker sets the time and
    the failure budget).  A hot standby builds these ahead (``gcs.server.ha_mirror``)."""
    return _NodeHealth(address=raylet_address(node), next_check_s=0.0, failures_left=0)


class HealthChecker:
    def __init__(
        self,
        nodes: NodeManager,
        raylets: RayletGateway,
        clock: Clock,
        config: HealthCheckConfig,
        *,
        rng: random.Random | None = None,
        tick_s: float = 0.2,
    ) -> None:
        self._nodes = nodes
        self._raylets = raylets
        self._clock = clock
        self._config = config
        self._rng = rng or random.Random()
        self._period_s = config.period_ms / 1000
        self._timeout_s = config.timeout_ms / 1000
        self._state: dict[bytes, _NodeHealth] = {}
        self._due: list[tuple[float, int, bytes]] = []
        """Heap of (due time, tie-break, node id); entries whose time no longer matches the
        node's ``next_check_s`` (or whose node is gone) are stale and skipped."""
        self._seq = itertools.count()
        self._loaded: Iterator[tuple[bytes, float]] = iter(())
        """First checks of the nodes loaded at start, in time order, drawn as they come due."""
        self._next_loaded: tuple[bytes, float] | None = None
        self._running = 0
        self._checks = Background("health")
        self._tick_s = tick_s
        self.checks = 0
        self.failures = 0

    # NodeListener
    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        first = (
            self._clock.monotonic_s()
            + self._config.initial_delay_ms / 1000
            + self._rng.random() * self._period_s
        )
        state = self._state[node.node_id] = node_health(node)
        state.next_check_s = first
        state.failures_left = self._config.failure_threshold
        self._schedule(node.node_id, first)

    def on_nodes_loaded(
        self, nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo], prepared: Prepared
    ) -> None:
        """A hot standby's records are adopted; their first checks are spread over one period
        after the initial delay and queued as they come due (:meth:`_queue_loaded`)."""
        states = prepared(node_health, nodes.items())
        threshold = self._config.failure_threshold
        for state in states.values():
            state.failures_left = threshold
        self._state.update(states)
        start = self._clock.monotonic_s() + self._config.initial_delay_ms / 1000
        order = spread_lazily(list(states), self._period_s, self._rng)
        self._loaded = ((node_id, start + offset) for node_id, offset in order)
        self._next_loaded = next(self._loaded, None)

    def _queue_loaded(self, now: float) -> None:
        """Loaded nodes whose first check is due join the heap (one gone since is skipped)."""
        while self._next_loaded is not None and self._next_loaded[1] <= now:
            node_id, due_s = self._next_loaded
            state = self._state.get(node_id)
            if state is not None:
                state.next_check_s = due_s
                self._schedule(node_id, due_s)
            self._next_loaded = next(self._loaded, None)

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        self._state.pop(node.node_id, None)

    def mark_healthy(self, node_id: bytes) -> None:
        """Any fresh report from the raylet (e.g. a load poll) counts as a heartbeat."""
        state = self._state.get(node_id)
        if state is not None:
            state.last_healthy_s = self._clock.monotonic_s()

    @property
    def in_flight(self) -> int:
        return self._running

    def _schedule(self, node_id: bytes, due_s: float) -> None:
        heapq.heappush(self._due, (due_s, next(self._seq), node_id))

    def tick(self) -> int:
        """Start due checks while slots are free; returns how many were started."""
        now = self._clock.monotonic_s()
        self._queue_loaded(now)
        period_s = self._period_s
        due = self._due
        started = 0
        while due and due[0][0] <= now and self._running < self._config.max_concurrent:
            due_s, _, node_id = heapq.heappop(due)
            state = self._state.get(node_id)
            if state is None or state.in_flight or state.next_check_s != due_s:
                continue  # stale entry
            if now - state.last_healthy_s < period_s:
                # Ray skips the RPC when the node proved alive within a period
                state.failures_left = self._config.failure_threshold
                state.next_check_s = now + period_s
                self._schedule(node_id, state.next_check_s)
                continue
            state.in_flight = True
            self._running += 1
            self._checks.spawn(self._check(node_id, state, now), "check")
            started += 1
        return started

    async def _check(self, node_id: bytes, state: _NodeHealth, started_s: float) -> None:
        try:
            ok = await self._raylets.health_check(node_id, state.address, self._timeout_s)
        except GcsError:
            ok = False
        finally:
            state.in_flight = False
            self._running -= 1
        self.checks += 1
        if self._state.get(node_id) is not state:
            return
        state.next_check_s = started_s + self._period_s
        if ok:
            state.failures_left = self._config.failure_threshold
            self._schedule(node_id, state.next_check_s)
            return
        self.failures += 1
        state.failures_left -= 1
        log.debug("health.failed", node_id=node_id.hex(), left=state.failures_left)
        if state.failures_left > 0:
            self._schedule(node_id, state.next_check_s)
            return
        self._state.pop(node_id, None)
        try:
            await self._nodes.fail_unhealthy(node_id)
        except Exception:
            log.exception("health.mark_dead_failed", node_id=node_id.hex())
            # put it back so the next tick retries the (persisted) death
            if node_id in self._nodes.alive and node_id not in self._state:
                state.failures_left = 0
                state.next_check_s = self._clock.monotonic_s() + self._period_s
                self._state[node_id] = state
                self._schedule(node_id, state.next_check_s)

    async def run(self) -> None:
        while True:
            self.tick()
            await self._clock.sleep(self._tick_s)

    async def settle(self) -> None:
        """Until the checks started so far (and the deaths they cause) have finished."""
        await self._checks.settle()

    async def close(self) -> None:
        await self._checks.close()
