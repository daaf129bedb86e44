"""A small local demo cluster for ``gcs serve --demo N``: raylet agents plus synthetic load.

Half the agents are ``cpu4`` nodes, the rest ``gpu1`` nodes (at least one of each).  The
demo then keeps real demand in the cluster, placed through the raylets' lease RPCs exactly
as ``gcs submit`` does: running tasks, a backlog that does not fit right now, and a shape no
node can ever run (infeasible) -- all visible in ``gcs status``.  Tasks are re-submitted as
they finish so the picture stays alive.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from gcs.raylet.agent import RayletAgent, RayletConfig
from gcs.raylet.workload import TaskSpec, submit
from gcs.rpc.security import Security

log = structlog.get_logger("gcs.demo")

_LOAD = (
    # (resources, count, seconds): steady running work, backlog, and an infeasible shape.
    ({"CPU": 2.0}, 6, 120.0),
    ({"CPU": 1.0, "GPU": 1.0}, 3, 120.0),
    ({"CPU": 64.0}, 2, 120.0),
)


class DemoCluster:
    def __init__(
        self, gcs_address: str, *, nodes: int = 3, security: Security | None = None
    ) -> None:
        """``security``: the GCS's token/TLS (``gcs serve --auth-mode token --demo N``)."""
        if nodes < 1:
            raise ValueError("a demo cluster needs at least one node")
        self._address = gcs_address
        self._security = security
        self._count = nodes
        self.agents: list[RayletAgent] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        gpu_nodes = max(1, self._count // 2) if self._count > 1 else 0
        for i in range(self._count):
            gpu = i >= self._count - gpu_nodes
            config = RayletConfig(
                gcs_address=self._address,
                resources={"CPU": 4.0, "GPU": 1.0} if gpu else {"CPU": 4.0},
                node_type="gpu1" if gpu else "cpu4",
                labels={"zone": "a" if i % 2 == 0 else "b"},
                node_name=f"demo-{i}",
                instance_id=f"demo-{i}",
            )
            agent = RayletAgent(config, security=self._security)
            await agent.start()
            self.agents.append(agent)
        self._task = asyncio.get_running_loop().create_task(self._keep_load(), name="demo-load")
        log.info("demo.started", nodes=self._count)

    async def _keep_load(self) -> None:
        while True:
            for resources, count, seconds in _LOAD:
                try:
                    await submit(
                        self._address,
                        TaskSpec(resources, seconds),
                        count,
                        detach=True,
                        security=self._security,
                    )
                except Exception as err:  # the demo must never take the server down
                    log.warning("demo.submit_failed", error=repr(err))
            await asyncio.sleep(_LOAD[0][2])

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for agent in self.agents:
            await agent.stop()
