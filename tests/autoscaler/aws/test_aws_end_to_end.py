"""End to end on moto's EC2 server: a GCS, the autoscaler runtime with the ``aws`` provider
built from its registry row (endpoint and credentials from boto3's own environment), and
the test playing the machines (``machines.Machines``: a running instance boots its user
data as a ``gcs raylet`` agent with its instance id).

Demand -> instances of the right type, tags and user data -> raylets registered -> tasks
granted -> idle -> terminated, with the GCS's autoscaler restarted while the instances boot
(it adopts them: 0 duplicates, 0 leaks).  Then each fault injected at the EC2 API, with the
autoscaler's reaction and the words ``gcs status`` shows.  The rounds run on a stepped
clock; the raylets' idle time and ``submit`` run on wall time (bounded waits).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gcs.autoscaler.config import resolve_cluster_config
from gcs.autoscaler.reconciler import ReconcileConfig
from gcs.autoscaler.runtime import AutoscalerRuntime
from gcs.cli.status import render_events
from gcs.policy.autoscaling.model import InstanceStatus as S
from gcs.raylet.agent import RayletAgent, RayletConfig
from gcs.raylet.workload import TaskSpec, submit
from gcs.sdk import get_autoscaler_events
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.autoscaler.aws.cloud import IMAGE, REGION, Ec2World, shared_world
from tests.autoscaler.aws.machines import Machines, head_instance
from tests.autoscaler.clock import SteppedClock
from tests.autoscaler.driving import HANG_S, Rounds, holds
from tests.conftest import eventually, fast_config

pytestmark = pytest.mark.slow

NAME = "aws-e2e"
M5_LARGE = {"InstanceType": "m5.large", "ImageId": IMAGE}


def cluster_raw(**extra_types: Any) -> dict[str, Any]:
    return {
        "cluster_name": NAME,
        "max_workers": 6,
        "upscaling_speed": 100,
        "provider": {
            "type": "aws",
            "region": REGION,
            "availability_zone": "us-west-2a,us-west-2b",
            "cache_stopped_nodes": False,
        },
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "node_config": M5_LARGE},
            "cpu": {
                "resources": {},  # filled from describe_instance_types, as Ray does
                "max_workers": 4,
                "idle_timeout_s": 1,
                "priority": 1,
                "node_config": M5_LARGE,
                "worker_setup_commands": ["echo ready"],
            },
            **extra_types,
        },
    }


class Cluster:
    def __init__(self, world: Ec2World, tmp: Path, config: ReconcileConfig | None) -> None:
        self.world = world
        self.tmp = tmp
        self.config = config
        self.server = GcsServer(fast_config(), store=MemoryStore())
        self.clock = SteppedClock()
        self.machines = Machines(world, NAME)
        self.head: RayletAgent | None = None
        self.rt: AutoscalerRuntime | None = None

    async def start(self, raw: dict[str, Any]) -> Cluster:
        await self.server.start()
        self.cluster = await resolve_cluster_config(raw)  # resources from the EC2 API
        # the head machine (``ray up``'s), running this GCS and the head raylet
        head_id = head_instance(self.world, NAME, IMAGE)
        self.head = RayletAgent(
            RayletConfig(
                gcs_address=self.server.address,
                resources={"CPU": 0.0},
                node_type="head",
                instance_id=head_id,
                node_name=head_id,
                is_head=True,
            )
        )
        await self.head.start()
        await self.autoscaler()
        return self

    async def autoscaler(self) -> None:
        """(Re)start the autoscaler: a new runtime on the GCS's store, as a restarted GCS."""
        self.rt = AutoscalerRuntime(
            self.cluster, self.server.address, state_dir=self.tmp / "provider",
            store=self.server.store, clock=self.clock, interval_s=1.0, config=self.config,
        )  # fmt: skip
        self.rounds = Rounds(self.rt, self.clock)
        await self.rounds.first()

    async def step(self, predicate: Any) -> None:
        """Machines boot, the GCS polls its raylets, a round runs -- until ``predicate``."""
        assert self.server.managers is not None

        async def once() -> bool:
            await self.machines.step()
            await self.server.managers.poller.poll_once()  # type: ignore[union-attr]
            await self.rounds.round()
            await self.machines.step()
            return await holds(predicate)

        await eventually(once, timeout_s=HANG_S, interval_s=0.05)

    def workers(self, *states: str) -> list[dict[str, Any]]:
        insts = self.world.instances(NAME, states)
        return [i for i in insts if _tags(i).get("ray-node-type") == "worker"]

    def statuses(self) -> list[S]:
        assert self.rt is not None
        return [i.status for i in self.rt.instances.instances.values()]

    async def events_text(self) -> str:
        assert self.rt is not None
        await self.rounds.round()  # publishes what the last round logged
        return render_events(await asyncio.to_thread(get_autoscaler_events, self.server.address))

    async def close(self) -> None:
        if self.rt is not None:
            await self.rt.close()
        await self.machines.close()
        if self.head is not None:
            await self.head.stop()
        await self.server.stop()


def _tags(inst: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


@pytest.fixture
async def ec2(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Ec2World]:
    world = shared_world()
    for key, value in world.env().items():
        monkeypatch.setenv(key, value)
    yield world


async def make(ec2: Ec2World, tmp: Path, raw: dict[str, Any], **cfg: Any) -> Cluster:
    return await Cluster(ec2, tmp, ReconcileConfig(**cfg) if cfg else None).start(raw)


async def test_demand_to_raylets_and_back_with_a_restart_midway(
    ec2: Ec2World, tmp_path: Path
) -> None:
    c = await make(ec2, tmp_path, cluster_raw())
    work = None
    try:
        assert dict(c.cluster.scheduler.node_types["cpu"].resources) == {
            "CPU": 2.0, "memory": float(int(8 * 2**30 * 0.7)),
        }  # fmt: skip
        work = asyncio.ensure_future(
            submit(c.server.address, TaskSpec({"CPU": 2.0}, 1.0), 3, timeout_s=HANG_S)
        )

        async def launched() -> bool:
            return len(c.workers()) == 3

        # demand -> 3 x m5.large launched, tagged, with the user data that starts Ray here
        # (the machines do not boot yet)
        async def step_no_boot() -> bool:
            await c.server.managers.poller.poll_once()  # type: ignore[union-attr]
            await c.rounds.round()
            return await launched()

        await eventually(step_no_boot, timeout_s=HANG_S, interval_s=0.05)
        first = {i["InstanceId"]: i for i in c.workers()}
        for inst in first.values():
            tags = _tags(inst)
            assert inst["InstanceType"] == "m5.large"
            assert (tags["ray-cluster-name"], tags["ray-user-node-type"]) == (NAME, "cpu")
            assert tags["ray-launch-request"]
            script = ec2.user_data(inst["InstanceId"])
            assert f"ray start --address={c.server.address} --num-cpus=2 --memory=" in script
            assert "echo ready" in script
        # the GCS's autoscaler restarts before any raylet registered: it adopts the three
        assert c.rt is not None
        added = [e.message for e in c.rt.events.recent(100) if e.kind == "launch"]
        assert len(added) == 1 and "cpu" in added[0], added
        await c.rt.close()
        await c.autoscaler()
        await c.step(lambda: c.statuses().count(S.RAY_RUNNING) == 4)  # the head and 3
        assert sorted(c.machines.booted) == sorted(first)  # 0 duplicates: nothing else launched
        result = await asyncio.wait_for(work, HANG_S)
        # placed on the head first (no CPU there), then moved to the three new raylets
        assert result.granted == 3 and result.moved == 3 and len(result.ran_on) == 3, result
        assert result.abandoned == 0
        # idle -> drained -> terminated in EC2, their raylets gone with them
        await c.step(lambda: not c.workers("pending", "running") and not c.machines.agents)
        assert {i["InstanceId"] for i in c.workers()} == set(first)  # 0 leaks
        assert ec2.proxy.calls["RunInstances"] == 1
        text = await c.events_text()
        assert text.count("Draining node") == 3 and "Removing" in text, text
        assert all(iid in text for iid in first), text
    finally:
        if work is not None and not work.done():
            work.cancel()
        await c.close()


async def test_each_fault_with_its_reaction_in_words(ec2: Ec2World, tmp_path: Path) -> None:
    """m5.large has no capacity -> held back, demand goes to the spot m5.xlarge type; AWS
    interrupts that spot instance -> it is held back too; m5.large has capacity again and
    the first one launched never boots -> given up after the allocation timeout and
    terminated, the next one runs the work.  ``gcs status``'s events say each."""
    spot = {
        "resources": {},
        "max_workers": 2,
        "idle_timeout_s": 1,
        "node_config": {**M5_LARGE, "InstanceType": "m5.xlarge",
                        "InstanceMarketOptions": {"MarketType": "spot"}},
    }  # fmt: skip
    raw = {**cluster_raw(spot=spot), "capacity_backoff": {"initial_s": 3, "max_s": 3}}
    c = await make(ec2, tmp_path, raw, allocate_status_timeout_s=4)
    try:
        no_m5_large = ec2.fail(
            "RunInstances", "InsufficientInstanceCapacity", times=10**6,
            message="We currently do not have sufficient m5.large capacity",
            when=lambda p: p.get("InstanceType") == "m5.large",
        )  # fmt: skip
        work = asyncio.ensure_future(
            submit(c.server.address, TaskSpec({"CPU": 2.0}, 0.5), 1, timeout_s=HANG_S)
        )
        # capacity: refused in both zones, held back; the spot type takes the demand
        await c.step(work.done)
        assert (await work).granted == 1
        (spot_inst,) = c.workers("running")
        assert spot_inst["InstanceType"] == "m5.xlarge"
        assert spot_inst["InstanceLifecycle"] == "spot"
        assert no_m5_large.hits == 2  # us-west-2a, then us-west-2b
        text = await c.events_text()
        assert (
            "Launch of 1 x cpu failed: the cloud has no capacity for it "
            "(InsufficientInstanceCapacity: We currently do not have sufficient m5.large "
            "capacity in subnet-"
        ) in text, text
        assert (
            "cpu is held back 3 s (1st refusal in a row) and pending demand goes to other "
            "node types that fit"
        ) in text

        # a spot interruption: the instance and its raylet go; spot is held back
        ec2.spot_interrupt(spot_inst["InstanceId"])
        nodes = c.server.managers.nodes  # type: ignore[union-attr]
        await c.step(lambda: not c.machines.agents and len(nodes.alive) == 1)  # the head
        text = await c.events_text()
        assert (
            f"Launch of 1 x spot failed: the cloud has no capacity for it (spot instance "
            f"{spot_inst['InstanceId']} (m5.xlarge in us-west-2a) was interrupted by AWS "
            "(Server.SpotInstanceTermination)); spot is held back 3 s"
        ) in text, text

        # capacity again; the first m5.large never boots: given up, terminated, replaced
        no_m5_large.times = no_m5_large.hits
        c.machines.broken_next = 1
        work = asyncio.ensure_future(
            submit(c.server.address, TaskSpec({"CPU": 2.0}, 0.5), 1, timeout_s=HANG_S)
        )
        await c.step(work.done)
        assert (await work).granted == 1
        (broken,) = c.machines.never_boot
        text = await c.events_text()
        assert f"Giving up on {broken} (cpu): no Ray node within 4 s; it is terminated" in text, (
            text
        )
        await c.step(lambda: not c.workers("pending", "running") and not c.machines.agents)
        launched = {i["InstanceId"] for i in c.workers()}
        assert len(launched) == 3 and broken in launched  # spot, broken, its replacement
        assert set(c.machines.booted) == launched - {broken}
    finally:
        await c.close()
