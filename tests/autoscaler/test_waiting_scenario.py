"""Why demand waits, told the same by every tool: capped, infeasible, tenant and untenanted
demand at once on an in-process GCS, the autoscaler runtime on a stepped clock, its nodes
in-process raylet agents (:mod:`tests.autoscaler.agent_provider`).

- untenanted ``3 x {GPU: 1}`` (``gcs submit``): gpu1 fits it but ``max_workers`` is 1 and
  the one gpu1 comes up busy (other work holds its GPU), so all three are capped; none is
  withdrawn (all were, the wire's list calling them infeasible), and once the other work
  frees the GPU all three run there, one after the other;
- untenanted ``{CPUS: 1}``: no node type has CPUS -- infeasible, cluster-wide, withdrawn by
  ``gcs submit`` (exit 1), though it waits on a node of virtual cluster team-a (it used to
  be booked to team-a, left out of the cluster-wide list, and never withdrawn);
- team-a's job asks ``2 x {CPU: 4}`` with team-a capped at one node: one runs, one is
  capped *in team-a*.

``gcs status``, ``gcs autoscaler plan``, the metrics and ``gcs submit`` give one answer.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.runtime import AutoscalerRuntime
from gcs.cli.main import main
from gcs.proto import gcs_pb2, gcs_service_pb2, virtual_cluster_pb2
from gcs.raylet.workload import TaskSpec, submit
from gcs.rpc.descriptors import JOB_INFO
from gcs.sdk import AsyncGcsClient
from gcs.sdk._vcluster_client import VirtualClusterClient
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.autoscaler.agent_provider import AGENT_PROVIDERS, AgentProvider
from tests.autoscaler.clock import SteppedClock
from tests.autoscaler.driving import HANG_S, Rounds
from tests.conftest import eventually, fast_config

pytestmark = pytest.mark.slow

CLUSTER: dict[str, Any] = {
    "cluster_name": "waiting",
    "max_workers": 10,
    "upscaling_speed": 100,
    "provider": {"type": "agents"},
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {"CPU": 0}, "max_workers": 0},
        "cpu4": {"resources": {"CPU": 4}, "min_workers": 1, "max_workers": 3},
        "gpu1": {"resources": {"CPU": 1, "GPU": 1}, "max_workers": 1},
    },
}
TEAM_JOB = b"\x0a\x00\x00\x00"
GPU_TASK_S = 0.5
"""Wall seconds each GPU task holds the gpu1 once it is free."""
Row = tuple[str, str, int, str]
"""(reason, shape as JSON, count, virtual cluster)."""


async def _cli(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, main, list(args))


def _rows(entries: list[dict[str, Any]]) -> Counter[Row]:
    return Counter(
        (
            e["reason"],
            json.dumps(e["resources"], sort_keys=True),
            e["count"],
            e.get("virtual_cluster", ""),
        )
        for e in entries
    )


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.server = GcsServer(fast_config(), store=MemoryStore())
        self.clock = SteppedClock()

    async def start(self) -> World:
        await self.server.start()
        self.address = self.server.address
        self.rt = AutoscalerRuntime(
            parse_cluster_config(CLUSTER, providers=AGENT_PROVIDERS),
            self.address,
            state_dir=self.tmp_path / "provider",
            store=self.server.store,
            clock=self.clock,
            interval_s=1.0,
            providers=AGENT_PROVIDERS,
        )
        self.rounds = Rounds(self.rt, self.clock)
        return self

    @property
    def provider(self) -> AgentProvider:
        return self.rt.provider  # type: ignore[return-value]

    async def close(self) -> None:
        await self.rt.shutdown_cluster()  # stops every agent
        await self.rt.close()
        await self.server.stop()

    async def polled(self, predicate: Any) -> None:
        """A load poll and a round, again, until ``predicate()`` holds.  Paced on wall time:
        what it waits for comes from outside the clock (a ``gcs submit`` placing leases, a
        raylet's view reaching the GCS)."""
        assert self.server.managers is not None
        poller = self.server.managers.poller

        async def after_a_round() -> bool:
            await poller.poll_once()
            await self.rounds.round()
            return bool(predicate())

        await eventually(after_a_round, timeout_s=HANG_S, interval_s=0.05)

    async def demand_seen(self, want: dict[str, int]) -> None:
        """Load polls until the GCS's cluster-wide demand holds ``want`` (shape JSON ->
        count), no round in between."""
        assert self.server.managers is not None
        poller = self.server.managers.poller

        async def seen() -> bool:
            await poller.poll_once()
            state = await self.rt.gcs.get_cluster_resource_state()
            got: Counter[str] = Counter()
            for r in state.pending_resource_requests:
                got[json.dumps(dict(r.request.resources_bundle), sort_keys=True)] += r.count
            return all(got[shape] == n for shape, n in want.items())

        await eventually(seen, timeout_s=HANG_S, interval_s=0.05)

    def waiting(self) -> Counter[Row]:
        return _rows([w.to_json() for w in self.rt.reconciler.waiting])

    def metric(self) -> dict[tuple[str, str], float]:
        (family,) = [
            f for f in self.rt.metric_families() if f.name == "gcs_autoscaler_waiting_requests"
        ]
        return {(s.labels["reason"], s.labels["virtual_cluster"]): s.value for s in family.samples}


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = await World(tmp_path).start()
    try:
        yield w
    finally:
        await w.close()


async def test_every_tool_tells_why_demand_waits_alike(world: World, tmp_path: Path) -> None:
    rounds = world.rounds
    world.provider.claims["gpu1"] = {"GPU": 1.0}  # the gpu1 comes up busy
    await rounds.first()  # the head, then min_workers: 1 x cpu4
    await rounds.until(lambda: len(world.provider.agent_of("cpu4")) == 1)
    [cpu4] = world.provider.agent_of("cpu4")
    await eventually(lambda: cpu4.node_id in world.server.managers.nodes.alive)  # type: ignore[union-attr]

    # team-a: the cpu4 node, capped at one node; its job asks two nodes' worth of work
    async with VirtualClusterClient(world.address) as vc:
        await vc.create_or_update("team-a", replica_sets={"cpu4": 1})
        reply = await vc.stub.UpdateAutoscalingConfig(
            virtual_cluster_pb2.UpdateAutoscalingConfigRequest(
                virtual_cluster_id="team-a",
                min_replica_sets={"cpu4": 1},
                max_replica_sets={"cpu4": 1},
                max_nodes=1,
            )
        )
        assert reply.status.code == 0, reply.status.message
    async with AsyncGcsClient(world.address) as client:
        added = await client.call(
            JOB_INFO,
            "AddJob",
            gcs_service_pb2.AddJobRequest(
                data=gcs_pb2.JobTableData(job_id=TEAM_JOB, virtual_cluster_id="team-a")
            ),
        )
        assert added.status.code == 0
    tenant = asyncio.ensure_future(
        submit(world.address, TaskSpec({"CPU": 4.0}, 3600, job_id=TEAM_JOB), 2, detach=True)
    )
    # untenanted: {CPUS: 1} fits no alive node, so it waits on the first node -- the head
    # or team-a's node, whichever id is lower; detached, it stays while the tools look
    untenanted = await submit(world.address, TaskSpec({"CPUS": 1.0}, 1), 1, detach=True)
    assert untenanted.infeasible == 1
    await tenant
    gpu_args = ["--resources", '{"GPU": 1}', "--count", "3", "--seconds", str(GPU_TASK_S)]
    gpu_submit = asyncio.ensure_future(
        _cli(
            "submit", "--address", world.address, *gpu_args, "--timeout", "120", "--format", "json"
        )
    )

    # the round that launches the gpu1: one task waits for it, two are capped already
    await world.demand_seen({'{"GPU": 1.0}': 3, '{"CPUS": 1.0}': 1, '{"CPU": 4.0}': 1})
    await rounds.round()
    assert world.waiting() == Counter(
        {
            ("pending-capacity", '{"GPU": 1.0}', 1, ""): 1,
            ("capped", '{"GPU": 1.0}', 2, ""): 1,
            ("infeasible", '{"CPUS": 1.0}', 1, ""): 1,
            ("capped", '{"CPU": 4.0}', 1, "team-a"): 1,
        }
    )
    # the gpu1 comes up busy: the three wait, capped at max_workers 1
    await world.polled(
        lambda: (
            len(world.provider.agent_of("gpu1")) == 1
            and ("capped", '{"GPU": 1.0}', 3, "") in world.waiting()
            and ("infeasible", '{"CPUS": 1.0}', 1, "") in world.waiting()
            and ("capped", '{"CPU": 4.0}', 1, "team-a") in world.waiting()
        )
    )
    expected = world.waiting()
    assert expected["infeasible", '{"CPUS": 1.0}', 1, ""] == 1
    assert not any(vc == "team-a" and r == "infeasible" for r, _, _, vc in expected)

    # gcs status (json and text)
    status = await _cli("status", "--address", world.address, "--format", "json")
    assert status.exit_code == 0, status.output
    assert _rows(json.loads(status.stdout)["waiting_demand"]) == expected
    text = (await _cli("status", "--address", world.address)).stdout.splitlines()
    infeasible = text.index(
        "Infeasible (no node type fits; they wait until the cluster config changes):"
    )
    assert text[infeasible + 1].startswith(" {CPUS: 1}: 1 pending tasks/actors - ")
    assert "{GPU: 1}" not in text[infeasible + 1] and "team-a" not in text[infeasible + 1]
    capped = text.index(
        "Capped (a node type fits but a limit stops the launch; they run when capacity frees):"
    )
    assert any(line.startswith(" {GPU: 1}: 3 pending tasks/actors - ") for line in text[capped:])
    assert any("[virtual cluster team-a]" in line for line in text[capped:])

    # gcs autoscaler plan, from the live GCS and the same config
    config = tmp_path / "cluster.json"
    config.write_text(json.dumps({**CLUSTER, "provider": {"type": "local"}}))  # plan launches none
    plan = await _cli(
        "autoscaler", "plan", "--config", str(config), "--address", world.address,
        "--format", "json",
    )  # fmt: skip
    assert plan.exit_code == 0, plan.output
    assert _rows(json.loads(plan.stdout)["waiting"]) == expected

    # the metric
    by_reason: Counter[tuple[str, str]] = Counter()
    for (reason, _, count, cluster), n in expected.items():
        by_reason[(reason, cluster)] += count * n
    assert world.metric() == {k: float(v) for k, v in by_reason.items()}

    # gcs submit of the infeasible shape: withdrawn, exit 1; the capped GPU work is kept and
    # runs, one task at a time on the one gpu1, as it frees up
    cpus = await _cli(
        "submit", "--address", world.address, "--resources", '{"CPUS": 1}', "--timeout", "120"
    )
    assert cpus.exit_code == 1, cpus.output
    assert "the autoscaler finds no node type that fits them" in cpus.stderr
    assert not gpu_submit.done()  # kept waiting
    world.provider.release_claims()  # capacity frees
    result = await gpu_submit
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["granted"] == 3 and summary["abandoned"] == 0, summary
    [gpu1] = world.provider.agent_of("gpu1")
    assert summary["ran_on"] == {f"{gpu1.config.host}:{gpu1.port}": 3}
