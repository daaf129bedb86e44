"""A small local demo cluster for ``gcs serve --demo N``: raylet agents plus synthetic load.

Half the agents are ``cpu4`` nodes, the rest ``gpu1`` nodes (at least one of each).  The
demo then keeps real demand in the cluster, placed through the raylets' lease RPCs exactly
as ``gcs submit`` does: running tasks, a backlog that does not fit right now, and a shape no
node can ever run (infeasible) -- all visible in ``gcs status``.

The load is a steady cycle, not a growing backlog: each cycle submits the same tasks
attached with a timeout of one cycle; when it ends every lease still waiting is cancelled
and every running one returned, then the next cycle starts.  Demand therefore never
exceeds one cycle's worth (ADR: detached leases that never fit would pile up forever).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import structlog

from gcs.base.changes import Changes
from gcs.base.clock import Clock, SystemClock
from gcs.raylet.agent import RayletAgent, RayletConfig
from gcs.raylet.workload import TaskSpec, submit
from gcs.rpc.security import Security

log = structlog.get_logger("gcs.raylet.demo")

CYCLE_S = 120.0
_IDLE_RETRY_S = 1.0
"""Pause after a cycle that placed nothing before trying again."""

LOAD: tuple[tuple[dict[str, float], int, float], ...] = (
    # (resources, count, fraction of a cycle each task runs): running work, a backlog
    # (more GPU tasks than GPUs), and an infeasible shape.
    ({"CPU": 2.0}, 6, 0.75),
    ({"CPU": 1.0, "GPU": 1.0}, 3, 0.75),
    ({"CPU": 64.0}, 2, 0.75),
)


class DemoCluster:
    def __init__(
        self,
        gcs_address: str,
        *,
        nodes: int = 3,
        cycle_s: float = CYCLE_S,
        load: Sequence[tuple[dict[str, float], int, float]] = LOAD,
        host: str = "127.0.0.1",
        security: Security | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``security``: the GCS's token/TLS (``gcs serve --auth-mode token --demo N``);
        ``clock`` times the pause after a cycle that placed nothing."""
        if nodes < 1:
            raise ValueError("a demo cluster needs at least one node")
        if cycle_s <= 0:
            raise ValueError("cycle_s must be > 0")
        self._address = gcs_address
        self._security = security
        self._count = nodes
        self._cycle_s = cycle_s
        self._load = tuple(load)
        self._host = host
        self.agents: list[RayletAgent] = []
        self.cycles = 0
        self.idle_cycles = 0
        """Cycles that placed nothing (no alive node yet, e.g. right after a restart)."""
        self.changes = Changes()
        """Notified after every cycle."""
        self._clock = clock or SystemClock()
        self._task: asyncio.Task[None] | None = None

    async def start(self, *, load: bool = True, agents: bool = True) -> None:
        """Start the agents (unless an autoscaler provides the nodes: ``agents=False``),
        then (``load``) the cycle of synthetic load."""
        gpu_nodes = max(1, self._count // 2) if self._count > 1 else 0
        for i in range(self._count if agents else 0):
            gpu = i >= self._count - gpu_nodes
            config = RayletConfig(
                gcs_address=self._address,
                resources={"CPU": 4.0, "GPU": 1.0} if gpu else {"CPU": 4.0},
                node_type="gpu1" if gpu else "cpu4",
                labels={"zone": "a" if i % 2 == 0 else "b"},
                host=self._host,
                node_name=f"demo-{i}",
                instance_id=f"demo-{i}",
            )
            agent = RayletAgent(config, security=self._security)
            await agent.start()
            self.agents.append(agent)
        if load:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._keep_load(), name="demo-load")
        log.info("demo.started", nodes=self._count, cycle_s=self._cycle_s)

    async def run_cycle(self) -> bool:
        """One cycle: submit the load attached; at the cycle's end withdraw what is left.
        False when nothing could be placed (every submit failed at once)."""
        runs = [
            submit(
                self._address,
                TaskSpec(resources, fraction * self._cycle_s),
                count,
                timeout_s=self._cycle_s,
                security=self._security,
            )
            for resources, count, fraction in self._load
        ]
        placed = False
        for outcome in await asyncio.gather(*runs, return_exceptions=True):
            if isinstance(outcome, BaseException):  # the demo must never take the server down
                log.warning("demo.submit_failed", error=repr(outcome))
                continue
            placed = True
            if outcome.unreachable:  # a raylet gone and not yet found dead
                log.warning(
                    "demo.raylets_unreachable", tasks=outcome.unreachable, error=outcome.last_error
                )
        self.cycles += 1
        return placed

    async def _keep_load(self) -> None:
        while True:
            placed = await self.run_cycle()
            if not placed:
                # nothing placed: no alive node yet (a restart before the raylets register);
                # without a pause the loop spun and logged hundreds of failures a second
                self.idle_cycles += 1
            self.changes.notify()
            if not placed:
                await self._clock.sleep(_IDLE_RETRY_S)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for agent in self.agents:
            await agent.stop()
