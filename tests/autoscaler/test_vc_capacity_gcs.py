"""A virtual cluster created beyond the free nodes, within the autoscaler's limits, is
filled by it (issue 27 item 8): the GCS accepts the request and the reconciler launches the
missing node and moves it in -- a real in-process GCS, the reconciler on the recording fake
provider, through the gRPC port the embedded autoscaler uses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gcs.policy.autoscaling.model import InstanceStatus as S
from gcs.server.extras import Extras, launchable_of
from gcs.store.memory import MemoryStore
from tests.autoscaler.test_reconciler import CLUSTER
from tests.autoscaler.test_vc_scaling_gcs import World
from tests.virtual_clusters.service_env import VcEnv


@pytest.fixture
async def world() -> AsyncIterator[World]:
    limits = launchable_of(Extras(autoscaler=CLUSTER))  # what `gcs serve` would weigh
    env = await VcEnv(MemoryStore(), extras=Extras(autoscaler_limits=limits)).start()
    try:
        yield World(env)
    finally:
        await env.close()


async def test_a_create_the_autoscaler_can_fill_is_accepted_then_filled(world: World) -> None:
    env = world.env
    await world.join("head", 0, **{"node:__internal_head__": 1})
    created = await env.create("vc1", {"type-1": 1})
    assert created.status.code == 0, created.status.message
    assert dict(created.node_instances) == {}
    await world.state_shows(
        lambda s: dict(s.virtual_cluster_states["vc1"].min_replica_sets) == {"type-1": 1}
    )

    await world.round()
    assert [shape for shape, _ in world.provider.launch_calls] == [{"type-1": 1}]
    await world.round()  # the provider's instance is allocated
    [launched] = [i for i in world.im.instances.values() if i.instance_type == "type-1"]
    assert launched.status is S.ALLOCATED
    new = await world.join("type-1", 4, instance_id=launched.cloud_instance_id)
    await world.state_shows(lambda s: new in s.virtual_cluster_states["kPrimaryClusterID"].nodes)
    await world.round()
    assert await world.members() == {new}
    assert len(world.provider.launch_calls) == 1

    # a divisible cluster is not filled by the autoscaler: still refused
    divisible = await env.create("vc2", {"type-1": 1}, divisible=True)
    assert divisible.status.code == 31
