"""Synthetic work: pure placement plan, then submit against agents behind a fake GCS."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from click.testing import CliRunner

from gcs.cli.raylet import cli
from gcs.proto import gcs_pb2
from gcs.raylet.agent import RayletAgent, RayletConfig
from gcs.raylet.convert import parse_selector
from gcs.raylet.resources import LABEL_IN
from gcs.raylet.testing import FakeGcs
from gcs.raylet.workload import NodeTarget, TaskSpec, plan, submit
from gcs.testing.ports import free_port


def node(i: int, cpu: float, **labels: str) -> NodeTarget:
    return NodeTarget(bytes([i]) * 28, f"127.0.0.1:{1000 + i}", {"CPU": cpu}, labels)


class TestPlan:
    """Tasks spread over nodes that can fit them; the rest go to one node as infeasible."""

    def test_tasks_spread_round_robin_over_fitting_nodes(self) -> None:
        """Nodes too small for the shape get nothing."""
        nodes = [node(1, 4), node(2, 1), node(3, 4)]
        placed = plan(TaskSpec({"CPU": 2}, 1), 4, nodes)
        assert [(n.node_id[0], ok) for n, ok in placed] == [(1, True), (3, True)] * 2

    def test_a_task_that_fits_no_node_goes_to_one_node_as_infeasible(self) -> None:
        """So its demand shows up as infeasible, as in Ray."""
        placed = plan(TaskSpec({"GPU": 1}, 1), 2, [node(2, 4), node(1, 4)])
        assert [(n.node_id[0], ok) for n, ok in placed] == [(1, False), (1, False)]

    def test_label_selectors_restrict_the_candidates(self) -> None:
        """Only nodes whose labels match are fitting."""
        nodes = [node(1, 4, zone="a"), node(2, 4, zone="b")]
        placed = plan(TaskSpec({"CPU": 1}, 1, (("zone", LABEL_IN, ("b",)),)), 2, nodes)
        assert {n.node_id[0] for n, _ in placed} == {2}

    def test_no_alive_nodes_is_an_error(self) -> None:
        """Nothing to send the tasks to."""
        with pytest.raises(ValueError):
            plan(TaskSpec({"CPU": 1}, 1), 1, [])

    def test_ray_selector_strings_parse(self) -> None:
        """in(...), !in(...), plain and negated values, parsed as Ray's client sends them."""
        assert parse_selector({"a": "in(x,y)", "b": "!in(z)", "c": "v", "d": "!w"}) == (
            ("a", 1, ("x", "y")),
            ("b", 2, ("z",)),
            ("c", 1, ("v",)),
            ("d", 2, ("w",)),
        )


class TestSubmit:
    """submit() finds alive nodes through the GCS and leases on the raylets."""

    async def test_attached_tasks_hold_resources_then_return_them(self, fake_gcs, make_agent):
        """Granted leases are returned after the hold; the nodes end idle."""
        agents = [await make_agent(resources={"CPU": 2.0}) for _ in range(2)]
        result = await submit(fake_gcs.address, TaskSpec({"CPU": 1.0}, 0.05), 4)
        assert result.granted == result.returned == 4
        assert sorted(result.placed.values()) == [2, 2]
        assert not any(a.resources.busy for a in agents)

    async def test_detached_tasks_stay_in_the_raylets(self, fake_gcs, make_agent, clock):
        """The command returns at once; raylets hold, queue and later free the leases (holds
        on the agent's fake clock: nothing is freed before the test moves time)."""
        agent = await make_agent(resources={"CPU": 1.0})
        result = await submit(fake_gcs.address, TaskSpec({"CPU": 1.0}, 0.1), 2, detach=True)
        assert (result.granted, result.queued) == (1, 1)
        assert agent.resources.busy
        assert agent.resources.load()[1][0].ready == 1
        await clock.advance_until(
            lambda: not agent.resources.busy and not agent.resources.load()[1], step_s=0.1
        )

    async def test_infeasible_tasks_show_up_as_infeasible_demand(self, fake_gcs, make_agent):
        """Detached infeasible tasks wait on one node and count as infeasible there."""
        agent = await make_agent(resources={"CPU": 1.0})
        result = await submit(fake_gcs.address, TaskSpec({"GPU": 1.0}, 1), 3, detach=True)
        assert (result.infeasible, result.queued) == (3, 3)
        [row] = agent.resources.load()[1]
        assert row.infeasible == 3

    async def test_attached_timeout_withdraws_waiting_requests(self, fake_gcs, make_agent):
        """After the timeout queued requests are cancelled and stop counting as demand."""
        agent = await make_agent(resources={"CPU": 1.0})
        result = await submit(fake_gcs.address, TaskSpec({"GPU": 1.0}, 1), 2, timeout_s=0.2)
        assert result.granted == 0
        await agent.resources.changes.until(lambda: not agent.resources.load()[1])

    async def test_a_gone_raylet_is_counted_not_left_as_a_task_exception(
        self, fake_gcs, make_agent
    ) -> None:
        """A node still listed alive whose raylet is gone: its tasks come back as
        ``unreachable`` (before: an unretrieved exception per task with ``timeout_s``, which
        the demo logged as thousands of tracebacks; without it, the first error escaped)."""
        await make_agent(resources={"CPU": 1.0})
        gone = gcs_pb2.GcsNodeInfo(
            node_id=b"\x07" * 28,
            node_manager_address="127.0.0.1",
            node_manager_port=free_port(),  # nothing listens there
            resources_total={"CPU": 8.0},
            state=gcs_pb2.GcsNodeInfo.ALIVE,
        )
        fake_gcs.servicer.nodes[gone.node_id] = gone
        for timeout_s in (None, 30.0):
            result = await submit(
                fake_gcs.address, TaskSpec({"CPU": 8.0}, 0.01), 2, timeout_s=timeout_s
            )
            assert result.unreachable == 2 and result.timed_out == 0
            assert "UNAVAILABLE" in result.last_error


class TestCli:
    """The click commands run standalone (python -m gcs.cli.raylet)."""

    def test_submit_command_prints_a_json_summary(self) -> None:
        """CliRunner drives submit --detach; GCS and agent run on a loop in a thread."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        fake_gcs = FakeGcs()
        asyncio.run_coroutine_threadsafe(fake_gcs.start(), loop).result(10)
        agent = RayletAgent(
            RayletConfig(
                gcs_address=fake_gcs.address, resources={"CPU": 4}, subscribe_virtual_clusters=False
            )
        )
        try:
            asyncio.run_coroutine_threadsafe(agent.start(), loop).result(10)
            result = CliRunner().invoke(
                cli,
                [
                    "submit",
                    "--address",
                    fake_gcs.address,
                    "--resources",
                    '{"CPU": 2}',
                    "--count",
                    "3",
                    "--seconds",
                    "5",
                    "--detach",
                    "--format",
                    "json",
                ],
            )
            assert result.exit_code == 0, result.output
            summary = json.loads(result.output)
            assert (summary["granted"], summary["queued"]) == (2, 1)
            assert summary["placed"] == {agent.address: 3}
        finally:
            asyncio.run_coroutine_threadsafe(agent.stop(), loop).result(10)
            asyncio.run_coroutine_threadsafe(fake_gcs.stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)

    def test_gcs_address_falls_back_to_the_environment(self, monkeypatch) -> None:
        """Without --gcs-address and env the raylet command is a usage error."""
        monkeypatch.delenv("GCS_ADDRESS", raising=False)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        result = CliRunner().invoke(cli, ["raylet"])
        assert result.exit_code == 2
        assert "GCS_ADDRESS" in result.output

    def test_bad_resources_json_is_a_usage_error(self) -> None:
        """--resources must be a JSON object of numbers."""
        result = CliRunner().invoke(cli, ["raylet", "--gcs-address", "x:1", "--resources", "[1]"])
        assert result.exit_code == 2
