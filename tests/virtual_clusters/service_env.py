"""A running GCS plus fake raylets of two node types, driven over gRPC (service tests)."""

from __future__ import annotations

from typing import Any

import grpc

from gcs.base.clock import Clock, FakeClock, SystemClock
from gcs.config import GcsConfig
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2, virtual_cluster_pb2
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.server import GcsServer
from gcs.server.extras import Extras
from gcs.store import Store
from tests.conftest import Stubs, fast_config
from tests.server.fake_raylet import FakeRaylet

V = virtual_cluster_pb2
Req = gcs_service_pb2


def quiet_config(**overrides: Any) -> GcsConfig:
    """Fast polls; VC timers long unless a test shortens them."""
    base: dict[str, Any] = {
        "node_instances_replenish_interval_ms": 3_600_000,
        "expired_job_clusters_gc_interval_ms": 3_600_000,
    }
    base.update(overrides)
    return fast_config(**base)


class VcEnv:
    """``clock``: the GCS's; a :class:`FakeClock` makes polls, health checks and VC passes
    move only when the test moves it (the system clock by default)."""

    def __init__(
        self,
        store: Store,
        config: GcsConfig | None = None,
        *,
        clock: FakeClock | None = None,
        extras: Extras | None = None,
    ) -> None:
        self.store = store
        self.extras = extras
        self.config = config or quiet_config()
        self.fake_clock = clock
        self.clock: Clock = clock or SystemClock()
        self.server: GcsServer | None = None
        self.channel: grpc.aio.Channel | None = None
        self.raylets: list[FakeRaylet] = []

    async def start(self) -> VcEnv:
        self.server = GcsServer(self.config, store=self.store, clock=self.clock, extras=self.extras)
        await self.server.start()
        assert self.server.meta is not None
        self.channel = grpc.aio.insecure_channel(self.server.address)
        self.stubs = Stubs(self.channel, self.server.meta.cluster_id)
        md = [("ray_cluster_id", self.server.meta.cluster_id.hex())]
        self.vc = ServiceStub(self.channel, svc.VIRTUAL_CLUSTER_INFO, metadata=md, timeout_s=30)
        return self

    async def restart(self) -> None:
        await self.stop_server()
        await self.start()

    async def stop_server(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.server is not None:
            await self.server.stop()

    async def close(self) -> None:
        await self.stop_server()
        for raylet in self.raylets:
            await raylet.stop()

    @property
    def manager(self) -> Any:
        assert self.server is not None and self.server.managers is not None
        return self.server.managers.virtual_clusters

    async def add_nodes(self, node_type: str, count: int, cpus: float = 4) -> list[str]:
        ids = []
        for _ in range(count):
            raylet = FakeRaylet({"CPU": cpus}, node_type)
            await raylet.start()
            self.raylets.append(raylet)
            await self.stubs.node_info.RegisterNode(
                Req.RegisterNodeRequest(node_info=raylet.node_info())
            )
            ids.append(raylet.node_id.hex())
        return ids

    async def add_job(self, job_id: bytes, cluster_id: str) -> None:
        """A running job in ``cluster_id``: demand its raylet rows name is booked there."""
        reply = await self.stubs.jobs.AddJob(
            Req.AddJobRequest(
                data=gcs_pb2.JobTableData(job_id=job_id, virtual_cluster_id=cluster_id)
            )
        )
        assert reply.status.code == 0, reply.status.message

    def raylet(self, node_hex: str) -> FakeRaylet:
        return next(r for r in self.raylets if r.node_id.hex() == node_hex)

    async def kill(self, node_hex: str) -> None:
        await self.stubs.node_info.UnregisterNode(
            Req.UnregisterNodeRequest(
                node_id=bytes.fromhex(node_hex),
                node_death_info=common_pb2.NodeDeathInfo(
                    reason=common_pb2.NodeDeathInfo.EXPECTED_TERMINATION
                ),
            )
        )

    async def create(
        self,
        cluster_id: str,
        replica_sets: dict[str, int],
        *,
        divisible: bool = False,
        revision: int = 0,
    ) -> V.CreateOrUpdateVirtualClusterReply:
        return await self.vc.CreateOrUpdateVirtualCluster(
            V.CreateOrUpdateVirtualClusterRequest(
                virtual_cluster_id=cluster_id,
                divisible=divisible,
                replica_sets=replica_sets,
                revision=revision,
            )
        )

    async def clusters(self, cluster_id: str = "", include_jobs: bool = True) -> dict[str, Any]:
        reply = await self.vc.GetVirtualClusters(
            V.GetVirtualClustersRequest(
                virtual_cluster_id=cluster_id, include_job_clusters=include_jobs
            )
        )
        return {c.id: c for c in reply.virtual_cluster_data_list}

    async def stored_ids(self) -> set[str]:
        rows = await self.store.get_all("VIRTUAL_CLUSTER")
        return {k.decode() for k in rows}
