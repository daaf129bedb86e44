"""A virtual cluster keeps its reservation under the autoscaler, and every move the
autoscaler makes gives it a new revision (issue 18 items 7 and 8): the reconciler (on a
fake clock, rounds driven by the test) against a real in-process GCS with fake raylets,
through the same gRPC port the embedded and standalone autoscalers use."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gcs.base.errors import Unavailable
from gcs.proto import virtual_cluster_pb2
from gcs.rpc import ServiceStub
from gcs.store.memory import MemoryStore
from tests.autoscaler.test_vc_scaling_gcs import World, load
from tests.virtual_clusters.service_env import VcEnv

V = virtual_cluster_pb2
IDLE_MS = 900_000
"""Far past CLUSTER's idle timeout (1 minute)."""


@pytest.fixture
async def floor_world() -> AsyncIterator[World]:
    env = await VcEnv(MemoryStore()).start()
    try:
        yield World(env)
    finally:
        await env.close()


async def idle_member(world: World, declared: dict[str, int]) -> str:
    """The head, one type-1 node, ``vc1`` declared with ``declared`` holding it, the node
    reported idle for far longer than the idle timeout."""
    await world.join("head", 0, **{"node:__internal_head__": 1})
    node = await world.join("type-1", 4)
    created = await world.env.create("vc1", declared)
    assert created.status.code == 0 and set(created.node_instances) == {node}
    world.env.raylet(node).load = load(idle_ms=IDLE_MS)
    await world.state_shows(
        lambda s: any(
            n.node_id.hex() == node and n.idle_duration_ms >= IDLE_MS for n in s.node_states
        )
    )
    return node


async def allow_none(vc: ServiceStub, cluster_id: str = "vc1", node_type: str = "type-1") -> None:
    """The cluster's autoscaling config: ``node_type`` between 0 and 1 (its floor drops
    to 0)."""
    reply = await vc.UpdateAutoscalingConfig(
        V.UpdateAutoscalingConfigRequest(
            virtual_cluster_id=cluster_id,
            min_replica_sets={node_type: 0},
            max_replica_sets={node_type: 1},
            max_nodes=1,
        )
    )
    assert reply.status.code == 0, reply.status.message


async def test_an_idle_declared_node_stays_in_its_cluster(floor_world: World) -> None:
    """Item 7: vc1 declared {"type-1": 1}; its node idle past the timeout.  Rounds go by and
    the node stays (the old code released it in the first round, leaving vc1 with {});
    the GCS tells autoscalers the floor as min_replica_sets."""
    world = floor_world
    node = await idle_member(world, {"type-1": 1})
    for _ in range(3):
        await world.round()
    assert await world.members() == {node}
    assert world.kinds()["release"] == 0
    assert world.env.raylet(node).drains == []
    state = await world.gcs.get_cluster_resource_state()
    assert dict(state.virtual_cluster_states["vc1"].min_replica_sets) == {"type-1": 1}
    (data,) = (await world.env.clusters("vc1")).values()
    assert dict(data.declared_replica_sets) == {"type-1": 1}


async def test_a_release_the_config_allows_gives_a_new_revision(floor_world: World) -> None:
    """Item 8 (and 7's "unless min_replica_sets allows less"): with min 0 the idle node is
    released; vc1's revision changes, so the tenant's update at the old revision fails
    (the old code kept the revision and accepted it); the declared replica sets stay."""
    world = floor_world
    await idle_member(world, {"type-1": 1})
    await allow_none(world.env.vc)
    (before,) = (await world.env.clusters("vc1")).values()
    await world.round()
    assert await world.members() == set()
    assert world.kinds()["release"] == 1
    (after,) = (await world.env.clusters("vc1")).values()
    assert after.revision > before.revision
    assert dict(after.declared_replica_sets) == {"type-1": 1}
    stale = await world.env.create("vc1", {}, revision=before.revision)
    assert stale.status.code != 0 and "is expired" in stale.status.message
    fresh = await world.env.create("vc1", {}, revision=after.revision)
    assert fresh.status.code == 0, fresh.status.message


async def test_a_cluster_changed_since_the_round_read_it_is_not_released(
    floor_world: World,
) -> None:
    """The release carries the revision the autoscaler read: a tenant update between the
    read and the release (here: just before it) makes the GCS refuse it as expired, and the
    next round, reading afresh, releases."""
    world = floor_world
    node = await idle_member(world, {"type-1": 1})
    await allow_none(world.env.vc)
    await world.gcs.get_cluster_resource_state()  # the adapter reads vc1's revision
    (snap,) = (await world.env.clusters("vc1")).values()
    reply = await world.env.create("vc1", {"type-1": 1}, revision=snap.revision)
    assert reply.status.code == 0
    with pytest.raises(Unavailable, match="is expired"):
        await world.gcs.release_nodes("vc1", [node])
    assert await world.members() == {node}
    await world.round()  # reads vc1 afresh; min 0 still allows the release
    assert await world.members() == set()
