"""End to end on one machine: a STRICT_SPREAD group of 3 x {GPU: 1} makes the autoscaler
(local provider: real ``gcs raylet`` processes) launch 3 GPU nodes, the GCS places the
bundles there with the two-phase commit and the group becomes CREATED; ``kill -9`` of one of
those raylets reschedules only its bundle, which lands on a newly launched node.

The autoscaler's rounds run on a clock the test moves; raylets registering and dying are
events the GCS publishes; what a raylet reports is asked of it directly.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import pytest

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.providers.processes import ProcessRecords
from gcs.autoscaler.runtime import AutoscalerRuntime
from gcs.config import HealthCheckConfig
from gcs.policy.placement.naming import indexed_name
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2, node_manager_pb2
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import NODE_MANAGER
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.autoscaler.clock import SteppedClock
from tests.autoscaler.driving import NodeWatch, Rounds
from tests.conftest import Stubs, fast_config

pytestmark = pytest.mark.slow


async def raylet_totals(node: gcs_pb2.GcsNodeInfo) -> dict[str, float]:
    """What the raylet itself reports (GetResourceLoad), asked now."""
    address = f"{node.node_manager_address}:{node.node_manager_port}"
    async with grpc.aio.insecure_channel(address) as channel:
        stub = ServiceStub(channel, NODE_MANAGER, timeout_s=30)
        reply = await stub.GetResourceLoad(node_manager_pb2.GetResourceLoadRequest())
    return dict(reply.resources.resources_total)


PG = gcs_pb2.PlacementGroupTableData
PG_ID = bytes.fromhex("aa" * 14) + b"\x01\x00\x00\x00"
CLUSTER = {
    "cluster_name": "e2e-pg",
    "max_workers": 6,
    "upscaling_speed": 100,
    "provider": {"type": "local"},
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {"CPU": 0}, "max_workers": 0},
        "gpu1": {
            "resources": {"CPU": 1, "GPU": 1},
            "min_workers": 0,
            "max_workers": 5,
            "idle_timeout_s": 2,
        },
    },
}


async def test_strict_spread_gpu_group_launches_nodes_and_survives_a_raylet_kill(
    tmp_path: Path,
) -> None:
    # a killed raylet is dead within ~2 s; a live one starved ~1 s by a loaded machine is not
    health = HealthCheckConfig(
        initial_delay_ms=100, period_ms=200, timeout_ms=1000, failure_threshold=5
    )
    server = GcsServer(fast_config(health=health), store=MemoryStore())
    await server.start()
    assert server.managers is not None and server.meta is not None
    pgs, nodes = server.managers.placement_groups, server.managers.nodes
    state_dir = tmp_path / "provider"
    clock = SteppedClock()
    rt = AutoscalerRuntime(
        parse_cluster_config(CLUSTER),
        server.address,
        state_dir=state_dir,
        store=server.store,
        clock=clock,
        interval_s=1.0,
    )
    rounds = Rounds(rt, clock)
    watch = await NodeWatch(server.address).start()
    channel = grpc.aio.insecure_channel(server.address)
    stubs = Stubs(channel, server.meta.cluster_id)

    def gpu_nodes_running(count: int) -> bool:
        return len(watch.alive_of_type("gpu1")) == count

    try:
        await rounds.first()
        await watch.until(lambda w: len(w.alive) == 1)  # the head
        spec = common_pb2.PlacementGroupSpec(
            placement_group_id=PG_ID,
            name="gpus",
            strategy=common_pb2.STRICT_SPREAD,
            creator_job_id=PG_ID[-4:],
            bundles=[common_pb2.Bundle(unit_resources={"GPU": 1}) for _ in range(3)],
            is_detached=True,
        )
        reply = await stubs.pgs.CreatePlacementGroup(
            gcs_service_pb2.CreatePlacementGroupRequest(placement_group_spec=spec)
        )
        assert reply.status.code == 0
        await rounds.until(lambda: gpu_nodes_running(3), nodes=watch)
        ready = await stubs.pgs.WaitPlacementGroupUntilReady(
            gcs_service_pb2.WaitPlacementGroupUntilReadyRequest(placement_group_id=PG_ID),
            timeout=180,
        )
        assert ready.status.code == 0
        pg = pgs.groups[PG_ID]
        assert pg.state == PG.CREATED
        first = [b.node_id for b in pg.bundles]
        assert len(set(first)) == 3
        gpu_nodes = [n for n in nodes.alive.values() if n.node_type_name == "gpu1"]
        assert len(gpu_nodes) == 3 and {n.node_id for n in gpu_nodes} == set(first)
        # the committed bundles show up in the raylets' reports (Ray's resource names)
        for i, nid in enumerate(first):
            total = await raylet_totals(nodes.alive[nid])
            assert total[indexed_name("GPU", PG_ID, i)] == 1
        # kill -9 the raylet holding bundle 1: its death is published
        victim = nodes.alive[first[1]]
        record = ProcessRecords(state_dir).load()[victim.instance_id]
        os.kill(record.pid, signal.SIGKILL)
        await watch.until(lambda w: victim.node_id in w.dead)
        await rounds.until(lambda: pgs.groups[PG_ID].state == PG.RESCHEDULING)
        assert victim.node_id in watch.dead
        lost = pgs.groups[PG_ID]
        assert [b.node_id for b in lost.bundles] == [first[0], b"", first[2]]
        # the lost bundle's node is replaced; the group is placed again
        await rounds.until(lambda: gpu_nodes_running(3), nodes=watch)
        ready = await stubs.pgs.WaitPlacementGroupUntilReady(
            gcs_service_pb2.WaitPlacementGroupUntilReadyRequest(placement_group_id=PG_ID),
            timeout=180,
        )
        assert ready.status.code == 0 and pgs.groups[PG_ID].state == PG.CREATED
        again = [b.node_id for b in pgs.groups[PG_ID].bundles]
        assert again[0] == first[0] and again[2] == first[2]  # survivors kept their nodes
        assert again[1] not in first and nodes.is_alive(again[1])
        assert pgs.gang_requests() == []  # placed: no gang demand left
        assert rt.reconciler.failed_rounds == 0, rt.reconciler.last_error
    finally:
        await channel.close()
        await watch.close()
        await rt.shutdown_cluster()
        await rt.close()
        await server.stop()
