"""Graceful lifecycle: the demo's load is a steady cycle; a signalled raylet unregisters;
``gcs submit --timeout`` reports what timed out."""

from __future__ import annotations

import asyncio

from gcs.base.clock import FakeClock
from gcs.proto import gcs_pb2
from gcs.raylet.agent import RayletAgent, RayletConfig
from gcs.raylet.demo import DemoCluster
from gcs.raylet.workload import TaskSpec, submit
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import fast_config

SHORT_LOAD = (
    ({"CPU": 2.0}, 6, 0.5),  # more than fits: a backlog
    ({"CPU": 1.0, "GPU": 1.0}, 3, 0.5),
    ({"CPU": 64.0}, 2, 0.5),  # infeasible
)


def _leftover(demo: DemoCluster) -> tuple[int, int]:
    """(granted leases, waiting lease requests) summed over the demo's raylets."""
    granted = sum(len(a.resources.granted_ids()) for a in demo.agents)
    waiting = 0
    for agent in demo.agents:
        _, rows = agent.resources.load()
        waiting += sum(r.ready + r.infeasible for r in rows)
    return granted, waiting


class TestDemoLoad:
    async def test_each_cycle_leaves_nothing_behind(self) -> None:
        """After a cycle, no lease is held and no request waits: demand cannot pile up
        (the old demo re-submitted detached work every cycle, so the backlog grew)."""
        server = GcsServer(fast_config(), store=MemoryStore())
        await server.start()
        demo = DemoCluster(server.address, nodes=3, cycle_s=0.5, load=SHORT_LOAD)
        try:
            await demo.start(load=False)
            for _ in range(2):
                await demo.run_cycle()
                _granted, waiting = _leftover(demo)
                assert waiting == 0  # every request still waiting was withdrawn
                # a lease whose grant crossed the timeout on the wire is freed by the raylet
                # within the task's hold time: nothing is held for good
                for agent in demo.agents:  # no new work: each raylet only frees from here
                    await agent.resources.changes.until(
                        lambda a=agent: not a.resources.granted_ids() and not a.resources.load()[1]
                    )
                assert _leftover(demo) == (0, 0)
            assert demo.cycles == 2
        finally:
            await demo.stop()
            await server.stop()

    async def test_with_no_alive_node_the_load_waits_on_the_clock(self) -> None:
        """Before any raylet registers (a restart), a cycle places nothing: the load pauses on
        the clock instead of spinning (the old loop logged ~600 failures a second)."""
        clock = FakeClock()
        server = GcsServer(fast_config(), store=MemoryStore())
        await server.start()
        demo = DemoCluster(server.address, nodes=1, cycle_s=0.5, load=SHORT_LOAD, clock=clock)
        task = asyncio.create_task(demo._keep_load())
        try:
            await demo.changes.until(lambda: demo.idle_cycles == 1)
            for _ in range(20):
                await asyncio.sleep(0)
            assert demo.idle_cycles == 1 and demo.cycles == 1  # asleep, not spinning
            clock.advance(1.0)
            await demo.changes.until(lambda: demo.idle_cycles == 2)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await server.stop()


class TestRayletLeaves:
    async def test_leave_unregisters_with_expected_termination(self) -> None:
        """What SIGINT/SIGTERM run: the node is DEAD at once, EXPECTED_TERMINATION."""
        server = GcsServer(fast_config(), store=MemoryStore())
        await server.start()
        try:
            agent = RayletAgent(RayletConfig(gcs_address=server.address))
            await agent.start()
            await agent.leave()
            node = server.managers.nodes.dead.get(agent.node_id)
            assert node is not None, "the node was not unregistered"
            assert node.state == gcs_pb2.GcsNodeInfo.DEAD
            assert node.death_info.reason == node.death_info.EXPECTED_TERMINATION
            assert agent.node_id not in server.managers.nodes.alive
        finally:
            await server.stop()


class TestSubmitTimeout:
    async def test_timeout_counts_the_tasks_that_waited(self) -> None:
        """Nothing fits: every task is still waiting when the timeout strikes."""
        server = GcsServer(fast_config(), store=MemoryStore())
        await server.start()
        agent = RayletAgent(RayletConfig(gcs_address=server.address, resources={"CPU": 1.0}))
        try:
            await agent.start()
            result = await submit(server.address, TaskSpec({"CPU": 8.0}, 1.0), 2, timeout_s=0.2)
            assert (result.granted, result.timed_out) == (0, 2)
            _, rows = agent.resources.load()
            assert sum(r.ready + r.infeasible for r in rows) == 0  # withdrawn
        finally:
            await agent.stop()
            await server.stop()


class TestSubmitTimeoutCli:
    async def test_exit_code_3_and_what_timed_out(self) -> None:
        """`gcs submit --timeout` with nothing granted: JSON summary on stdout, one line on
        stderr naming how many tasks timed out, exit 3 (it used to exit 0)."""
        import json

        from click.testing import CliRunner

        from gcs.cli.main import main

        server = GcsServer(fast_config(), store=MemoryStore())
        await server.start()
        agent = RayletAgent(RayletConfig(gcs_address=server.address, resources={"CPU": 1.0}))
        try:
            await agent.start()
            args = ["submit", "--address", server.address, "--resources", '{"CPU": 8}']
            args += ["--count", "2", "--timeout", "0.3", "--format", "json"]
            result = await asyncio.to_thread(CliRunner().invoke, main, args)
        finally:
            await agent.stop()
            await server.stop()
        assert result.exit_code == 3, result.output
        summary = json.loads(result.stdout)
        assert (summary["granted"], summary["timed_out"]) == (0, 2)
        *notes, last = result.stderr.strip().splitlines()
        assert last == "Error: 2 of 2 tasks timed out after 0.3 s (0 granted)"
        assert notes == [
            'Warning: 2 of 2 tasks of {"CPU": 8.0} fit no alive node; they wait for the '
            "autoscaler to add a node that fits (Ctrl-C to stop, --timeout to give up)"
        ]
