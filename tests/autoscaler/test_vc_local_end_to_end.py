"""The issue's case end to end (issue 18 items 7 and 8): ``gcs vcluster create --id team-a
--replica-sets '{"cpu4": 1}'`` under the embedded autoscaler with the local provider (real
``gcs raylet`` processes).  The node idles; the autoscaler keeps it in team-a (it used to
release it: "Released idle node(s) ... from virtual cluster team-a", ``replica_sets {}``).
Once team-a's autoscaling config allows 0, the release happens and gives team-a a new
revision, so an update at the old one is refused (it used to be accepted).

The autoscaler runs on a fake clock, its rounds driven by the test; only the processes'
start-up is waited for (bounded).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc
import pytest

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.runtime import AutoscalerRuntime
from gcs.base.clock import FakeClock
from gcs.policy.autoscaling.scheduler.types import InstanceStatus as S
from gcs.policy.autoscaling.scheduler.types import NodeKind
from gcs.proto import autoscaler_pb2, virtual_cluster_pb2
from gcs.proto.virtual_cluster_data_pb2 import VirtualClusterTableData
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import VIRTUAL_CLUSTER_INFO
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.autoscaler.test_vc_floor_gcs import allow_none
from tests.conftest import eventually, fast_config

pytestmark = pytest.mark.slow

V = virtual_cluster_pb2
CLUSTER = {
    "cluster_name": "vc-e2e",
    "max_workers": 2,
    "upscaling_speed": 100,
    "provider": {"type": "local"},
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {"CPU": 0}, "max_workers": 0},
        # idle_timeout_s 0: idle at once, so no round waits for idle time to pass
        "cpu4": {"resources": {"CPU": 4}, "min_workers": 1, "max_workers": 2, "idle_timeout_s": 0},
    },
}


class Run:
    def __init__(self, server: GcsServer, rt: AutoscalerRuntime, vc: ServiceStub) -> None:
        self.server = server
        self.rt = rt
        self.vc = vc

    async def round(self) -> None:
        await self.rt.reconciler.reconcile_once()
        await self.rt.updater.settle()
        await self.rt.stopper.settle()

    async def idle_worker(self) -> str:
        """Rounds until the provider's cpu4 worker runs Ray and reports itself idle."""
        found: list[str] = []

        async def idle() -> bool:
            await self.round()
            running = [
                i.node_id
                for i in self.rt.instances.instances.values()
                if i.node_kind is NodeKind.WORKER and i.status is S.RAY_RUNNING and i.node_id
            ]
            state = await self.rt.gcs.get_cluster_resource_state()
            found[:] = [
                n.node_id.hex()
                for n in state.node_states
                if n.node_id.hex() in running
                and n.status == autoscaler_pb2.IDLE
                and n.idle_duration_ms > 0
            ]
            return bool(found)

        await eventually(idle, timeout_s=180, interval_s=0.2)
        return found[0]

    async def team_a(self) -> VirtualClusterTableData:
        reply = await self.vc.GetVirtualClusters(
            V.GetVirtualClustersRequest(virtual_cluster_id="team-a")
        )
        (data,) = reply.virtual_cluster_data_list
        return data

    def releases(self) -> list[str]:
        return [e.message for e in self.rt.events.recent(200) if e.kind == "release"]


async def gcs_cli(address: str, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gcs", "vcluster", *args, "--address", address,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_team_a_keeps_its_node_and_a_release_changes_its_revision(tmp_path: Path) -> None:
    server = GcsServer(fast_config(), store=MemoryStore())
    await server.start()
    rt = AutoscalerRuntime(
        parse_cluster_config(CLUSTER),
        server.address,
        state_dir=tmp_path / "provider",
        store=server.store,
        clock=FakeClock(),
    )
    channel = grpc.aio.insecure_channel(server.address)
    try:
        assert server.meta is not None
        md = [("ray_cluster_id", server.meta.cluster_id.hex())]
        run = Run(server, rt, ServiceStub(channel, VIRTUAL_CLUSTER_INFO, metadata=md))
        await rt.instances.load()
        await rt.ensure_head()
        worker = await run.idle_worker()

        await gcs_cli(server.address, "create", "--id", "team-a", "--replica-sets", '{"cpu4": 1}')
        created = await run.team_a()
        assert set(created.node_instances) == {worker}
        for _ in range(3):
            await run.round()
        kept = await run.team_a()
        assert set(kept.node_instances) == {worker}, run.releases()
        assert run.releases() == [] and kept.revision == created.revision
        assert dict(kept.declared_replica_sets) == {"cpu4": 1}

        # the tenant's autoscaling config allows 0: now the idle node goes back
        await allow_none(run.vc, "team-a", "cpu4")
        await run.round()
        released = await run.team_a()
        assert not released.node_instances and len(run.releases()) == 1
        assert released.revision > kept.revision
        stale = await run.vc.CreateOrUpdateVirtualCluster(
            V.CreateOrUpdateVirtualClusterRequest(
                virtual_cluster_id="team-a", replica_sets={}, revision=kept.revision
            )
        )
        assert "is expired" in stale.status.message
        # back in the primary, cpu4's min_workers 1 keeps the worker running
        await run.round()
        assert worker in {
            i.node_id for i in rt.instances.instances.values() if i.status is S.RAY_RUNNING
        }
    finally:
        await channel.close()
        await rt.shutdown_cluster()
        await rt.stop()
        await server.stop()
