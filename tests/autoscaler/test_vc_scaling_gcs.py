"""Virtual-cluster-aware scaling against a real in-process GCS (fake raylets, the recording
fake provider), through the same gRPC port the embedded and standalone autoscalers use."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from gcs.autoscaler.gcs_api import VcUpdate
from gcs.autoscaler.reconciler import GrpcAutoscalerGcs
from gcs.policy.autoscaling.model import InstanceStatus as S
from gcs.proto import gcs_pb2, gcs_service_pb2, virtual_cluster_pb2
from gcs.store.memory import MemoryStore
from tests.autoscaler.driving import load_polled
from tests.autoscaler.test_reconciler import CLUSTER, Harness
from tests.server.fake_raylet import FakeRaylet
from tests.virtual_clusters.service_env import VcEnv

V = virtual_cluster_pb2


class ConflictingGcs(GrpcAutoscalerGcs):
    """Before the next ``conflicts`` updates, someone else updates the cluster (a no-op
    CreateOrUpdate: same nodes, new revision), so the autoscaler's revision is stale."""

    def __init__(self, channel: Any) -> None:
        super().__init__(channel)
        self.conflicts = 0
        self.revisions: list[int] = []

    async def update_virtual_cluster(
        self, cluster_id: str, *, divisible: bool, replica_sets: Mapping[str, int], revision: int
    ) -> VcUpdate:
        self.revisions.append(revision)
        if self.conflicts > 0:
            self.conflicts -= 1
            snap = await self.read_virtual_cluster(cluster_id)
            assert snap is not None
            other = await super().update_virtual_cluster(
                cluster_id,
                divisible=divisible,
                replica_sets=snap.replica_sets,
                revision=snap.revision,
            )
            assert other.ok
        return await super().update_virtual_cluster(
            cluster_id, divisible=divisible, replica_sets=replica_sets, revision=revision
        )


VC1_JOB = b"\x01\x00\x00\x00"
"""A job running in vc1: the demand its rows name is vc1's."""


def load(
    demand_cpus: float = 0,
    count: int = 0,
    *,
    busy: bool = False,
    idle_ms: int = 0,
    job: bytes = VC1_JOB,
) -> gcs_pb2.ResourcesData:
    data = gcs_pb2.ResourcesData(idle_duration_ms=idle_ms)
    if busy:
        data.resources_available["CPU"] = 0.0
    if count:
        data.resource_load_by_shape.resource_demands.add(
            shape={"CPU": demand_cpus}, num_ready_requests_queued=count, job_id=job
        )
    return data


async def autoscaling_config(env: VcEnv, *, max_nodes: int) -> None:
    """vc1: min 1, max 3 of type-1, at most ``max_nodes`` nodes."""
    request = V.UpdateAutoscalingConfigRequest(
        virtual_cluster_id="vc1",
        min_replica_sets={"type-1": 1},
        max_replica_sets={"type-1": 3},
        max_nodes=max_nodes,
    )
    reply = await env.vc.UpdateAutoscalingConfig(request)
    assert reply.status.code == 0, reply.status.message


@pytest.fixture
async def world():  # type: ignore[no-untyped-def]
    env = await VcEnv(MemoryStore()).start()
    try:
        yield World(env)
    finally:
        await env.close()


class World(Harness):
    """The reconciler harness, over a real GCS (through ConflictingGcs) instead of a fake."""

    def __init__(self, env: VcEnv) -> None:
        assert env.channel is not None
        super().__init__(gcs=ConflictingGcs(env.channel), cluster=CLUSTER)
        self.env = env
        self.gcs: ConflictingGcs

    async def join(self, node_type: str, cpus: float, instance_id: str = "", **kw: Any) -> str:
        raylet = FakeRaylet({"CPU": cpus, **kw}, node_type)
        await raylet.start()
        self.env.raylets.append(raylet)
        info = raylet.node_info(**({"instance_id": instance_id} if instance_id else {}))
        await self.env.stubs.node_info.RegisterNode(
            gcs_service_pb2.RegisterNodeRequest(node_info=info)
        )
        return raylet.node_id.hex()

    async def members(self, cluster_id: str = "vc1") -> set[str]:
        snap = await self.gcs.read_virtual_cluster(cluster_id)
        assert snap is not None
        return set(snap.nodes)

    async def state_shows(self, check: Any) -> None:
        """Poll the fake raylets now until the GCS's state shows what they report."""

        async def ok() -> bool:
            state = await self.gcs.get_cluster_resource_state()
            return bool(check(state))

        assert self.env.server is not None
        await load_polled(self.env.server, ok)

    def kinds(self) -> Counter[str]:
        return Counter(e.kind for e in self.events.recent(200))


async def test_vc_demand_moves_then_launches_then_releases(world: World) -> None:
    env = world.env
    await world.join("head", 0, **{"node:__internal_head__": 1})
    first = await world.join("type-1", 4)
    spare = await world.join("type-1", 4)
    created = await env.create("vc1", {"type-1": 1})
    assert created.status.code == 0
    [member] = created.node_instances
    free = spare if member == first else first
    await autoscaling_config(env, max_nodes=1)
    await env.add_job(VC1_JOB, "vc1")
    env.raylet(member).load = load(4, 1, busy=True)
    await world.state_shows(
        lambda s: (
            len(s.virtual_cluster_states["vc1"].pending_resource_requests) == 1
            and s.virtual_cluster_states["vc1"].max_nodes == 1
        )
    )

    # max_nodes 1: the free primary node stays put and nothing launches
    await world.round()
    assert await world.members() == {member} and world.provider.launch_calls == []

    # max_nodes 3: demand met by moving the free primary node in, not by a launch
    await autoscaling_config(env, max_nodes=3)
    await world.state_shows(lambda s: s.virtual_cluster_states["vc1"].max_nodes == 3)
    await world.round()
    assert await world.members() == {member, free}
    assert world.provider.launch_calls == []

    # more demand, no free primary node: a launch of the VC's type, moved in once it joins;
    # someone else updates vc1 just before the move (a revision conflict), so it is retried
    env.raylet(free).load = load(busy=True)
    env.raylet(member).load = load(4, 2, busy=True)
    await world.state_shows(
        lambda s: (
            sum(r.count for r in s.virtual_cluster_states["vc1"].pending_resource_requests) == 2
            and len(s.virtual_cluster_states["kPrimaryClusterID"].nodes) == 1
        )  # the head
    )
    await world.round()
    assert [shape for shape, _ in world.provider.launch_calls] == [{"type-1": 1}]  # max_nodes 3
    await world.round()  # the provider's instance is allocated
    [launched] = [i for i in world.im.instances.values() if i.instance_type == "type-1"]
    assert launched.status is S.ALLOCATED
    new = await world.join("type-1", 4, instance_id=launched.cloud_instance_id)
    await world.state_shows(lambda s: new in s.virtual_cluster_states["kPrimaryClusterID"].nodes)
    world.gcs.conflicts = 1
    world.gcs.revisions.clear()
    await world.round()
    assert await world.members() == {member, free, new}
    assert len(world.gcs.revisions) == 2 and world.gcs.revisions[0] != world.gcs.revisions[1]
    assert world.im.instances[launched.instance_id].status is S.RAY_RUNNING
    assert len(world.provider.launch_calls) == 1

    # the work ends; all idle, the launched node longest: released to the primary first
    # (min_replica_sets type-1 = 1 keeps one, the least idle), then terminated
    env.raylet(new).load = load(idle_ms=900_000)
    env.raylet(free).load = load(idle_ms=800_000)
    env.raylet(member).load = load(idle_ms=600_000)
    await world.state_shows(
        lambda s: (
            not s.virtual_cluster_states["vc1"].pending_resource_requests
            and all(
                n.idle_duration_ms >= 600_000
                for n in s.node_states
                if n.node_id.hex() in (new, free, member)
            )
        )
    )
    await world.round()
    assert await world.members() == {member}
    assert world.kinds()["release"] == 1
    assert world.env.raylet(new).drains == []  # not drained while vc1 held it
    await world.round()
    assert len(world.env.raylet(new).drains) == 1
    assert world.im.instances[launched.instance_id].status is not S.RAY_RUNNING
    assert world.env.raylet(member).drains == []
    assert await world.members() == {member}
    assert {"vc-move", "vc-launch", "release"} <= set(world.kinds())


async def test_demand_is_booked_to_a_virtual_cluster_only_when_its_job_runs_there(
    world: World,
) -> None:
    """An untenanted `gcs submit` whose infeasible task waited on a team-a member was
    logged as team-a's demand and scaled for team-a.  Now the queue's node does not decide:
    rows of no job, or of a job outside vc1, stay cluster-wide; vc1's job's rows are vc1's,
    wherever they wait (here on a primary node)."""
    env = world.env
    await world.join("head", 0, **{"node:__internal_head__": 1})
    first = await world.join("type-1", 4)
    spare = await world.join("type-1", 4)
    created = await env.create("vc1", {"type-1": 1})
    [member] = created.node_instances
    other = spare if member == first else first
    await env.add_job(VC1_JOB, "vc1")
    await env.add_job(b"\x02\x00\x00\x00", "")  # a job of the primary
    data = load(4, 1, busy=True, job=b"")  # no job named (as a Ray raylet reports)
    data.resource_load_by_shape.resource_demands.add(
        shape={"CPUS": 1}, num_infeasible_requests_queued=2, job_id=b"\x02\x00\x00\x00"
    )
    env.raylet(member).load = data
    env.raylet(other).load = load(2, 3, busy=True)  # vc1's job, on a primary node
    await world.state_shows(
        lambda s: (
            sum(r.count for r in s.pending_resource_requests) == 6
            and "vc1" in s.virtual_cluster_states
        )
    )
    state = await world.gcs.get_cluster_resource_state()
    vc1 = state.virtual_cluster_states["vc1"]
    assert [(dict(r.request.resources_bundle), r.count) for r in vc1.pending_resource_requests] == [
        ({"CPU": 2.0}, 3)
    ]
