"""Jobs and virtual clusters: AddJob checks, lazy job-cluster destruction, GC."""

from __future__ import annotations

import os

import grpc
import pytest

from gcs.base.clock import FakeClock
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2, virtual_cluster_pb2
from gcs.store.memory import MemoryStore
from tests.virtual_clusters.service_env import VcEnv, quiet_config

V = virtual_cluster_pb2
Req = gcs_service_pb2


async def add_job(env, job_id: bytes, cluster_id: str) -> gcs_pb2.GcsStatus:
    reply = await env.stubs.jobs.AddJob(
        Req.AddJobRequest(data=gcs_pb2.JobTableData(job_id=job_id, virtual_cluster_id=cluster_id))
    )
    return reply.status


async def job_cluster(env, parent: str, job: str, replica_sets: dict[str, int]) -> str:
    reply = await env.vc.CreateJobCluster(
        V.CreateJobClusterRequest(virtual_cluster_id=parent, job_id=job, replica_sets=replica_sets)
    )
    assert reply.status.code == 0, reply.status.message
    return reply.job_cluster_id


class TestAddJob:
    async def test_jobs_in_divisible_or_unknown_clusters_are_rejected(self, memory_env) -> None:
        """AddJob answers InvalidArgument in the reply status for a divisible or unknown
        cluster and accepts an indivisible one; rejected jobs are not stored."""
        await memory_env.create("div", {"4c8g": 1}, divisible=True)
        await memory_env.create("ind", {"4c8g": 1})
        for job_id, cluster_id in ((b"\x01\x00\x00\x00", "div"), (b"\x02\x00\x00\x00", "nope")):
            status = await add_job(memory_env, job_id, cluster_id)
            assert (status.code, status.message) == (
                34,
                f"Invalid virtual cluster, virtual cluster id: {cluster_id}",
            )
            assert job_id not in memory_env.server.managers.jobs.jobs
        assert (await add_job(memory_env, b"\x03\x00\x00\x00", "ind")).code == 0
        assert (await add_job(memory_env, b"\x04\x00\x00\x00", "")).code == 0

    async def test_a_ray_2_60_job_names_its_cluster_in_the_job_config_metadata(
        self, memory_env
    ) -> None:
        """An unmodified Ray 2.60 driver cannot set field 13: ``JobConfig.metadata
        ["virtual_cluster_id"]`` stands for it (stored in the field, checked the same way,
        and its placement groups belong to that cluster)."""
        await memory_env.create("ind", {"4c8g": 1})
        jobs = memory_env.server.managers.jobs

        def job(job_id: bytes, cluster_id: str) -> gcs_pb2.JobTableData:
            data = gcs_pb2.JobTableData(job_id=job_id)
            data.config.metadata["virtual_cluster_id"] = cluster_id
            return data

        reply = await memory_env.stubs.jobs.AddJob(
            Req.AddJobRequest(data=job(b"\x07\0\0\0", "ind"))
        )
        assert reply.status.code == 0, reply.status.message
        assert jobs.jobs[b"\x07\0\0\0"].virtual_cluster_id == "ind"
        reply = await memory_env.stubs.jobs.AddJob(
            Req.AddJobRequest(data=job(b"\x08\0\0\0", "nope"))
        )
        assert (reply.status.code, reply.status.message) == (
            34,
            "Invalid virtual cluster, virtual cluster id: nope",
        )
        pg_id = os.urandom(18)
        spec = common_pb2.PlacementGroupSpec(
            placement_group_id=pg_id,
            creator_job_id=b"\x07\0\0\0",
            bundles=[common_pb2.Bundle(unit_resources={"CPU": 1})],
        )
        await memory_env.stubs.pgs.CreatePlacementGroup(
            Req.CreatePlacementGroupRequest(placement_group_spec=spec)
        )
        assert memory_env.server.managers.placement_groups.virtual_cluster_of[pg_id] == "ind"

    async def test_an_overlong_cluster_id_in_the_metadata_is_refused_naming_it(
        self, memory_env
    ) -> None:
        data = gcs_pb2.JobTableData(job_id=b"\x09\0\0\0")
        data.config.metadata["virtual_cluster_id"] = "x" * 100_000
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await memory_env.stubs.jobs.AddJob(Req.AddJobRequest(data=data))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "data.config.metadata[virtual_cluster_id]" in (err.value.details() or "")


class TestJobClusterLifecycle:
    async def test_finished_job_removes_its_idle_job_cluster(self, memory_env) -> None:
        """When the job ends, its job cluster is deleted and its nodes return to the parent."""
        await memory_env.create("div", {"4c8g": 2}, divisible=True)
        jcid = await job_cluster(memory_env, "div", "job1", {"4c8g": 2})
        job_id = b"\x05\x00\x00\x00"
        assert (await add_job(memory_env, job_id, jcid)).code == 0
        await memory_env.stubs.jobs.MarkJobFinished(Req.MarkJobFinishedRequest(job_id=job_id))
        await memory_env.manager.settle()
        assert jcid not in await memory_env.clusters()
        assert jcid not in await memory_env.stored_ids()
        parent = memory_env.manager.registry.get("div")
        assert parent.undivided() == sorted(parent.members)

    async def test_detached_pg_keeps_the_job_cluster_until_removed(self, memory_env) -> None:
        """A detached PG created by the job keeps its job cluster alive after the job ends;
        removing the PG removes the job cluster."""
        await memory_env.create("div", {"4c8g": 1}, divisible=True)
        jcid = await job_cluster(memory_env, "div", "job2", {"4c8g": 1})
        job_id = b"\x06\x00\x00\x00"
        await add_job(memory_env, job_id, jcid)
        pg_id = os.urandom(18)
        spec = common_pb2.PlacementGroupSpec(
            placement_group_id=pg_id,
            creator_job_id=job_id,
            is_detached=True,
            bundles=[common_pb2.Bundle(unit_resources={"CPU": 1})],
        )
        await memory_env.stubs.pgs.CreatePlacementGroup(
            Req.CreatePlacementGroupRequest(placement_group_spec=spec)
        )
        assert memory_env.server.managers.placement_groups.virtual_cluster_of[pg_id] == jcid
        await memory_env.stubs.jobs.MarkJobFinished(Req.MarkJobFinishedRequest(job_id=job_id))
        await memory_env.manager.settle()
        assert memory_env.manager.registry.get(jcid).job_dead
        assert jcid in await memory_env.clusters()
        await memory_env.stubs.pgs.RemovePlacementGroup(
            Req.RemovePlacementGroupRequest(placement_group_id=pg_id)
        )
        await memory_env.manager.settle()
        assert jcid not in await memory_env.clusters()

    async def test_busy_job_cluster_is_collected_once_idle(self) -> None:
        """A job cluster whose node is busy when the job ends is kept, then removed by the
        periodic GC after the node reports idle."""
        clock = FakeClock()
        env = await VcEnv(
            MemoryStore(), quiet_config(expired_job_clusters_gc_interval_ms=100), clock=clock
        ).start()
        try:
            (node,) = await env.add_nodes("4c8g", 1)
            await env.create("div", {"4c8g": 1}, divisible=True)
            jcid = await job_cluster(env, "div", "job3", {"4c8g": 1})
            raylet = env.raylet(node)
            raylet.load = gcs_pb2.ResourcesData(resources_available={"CPU": 1})
            cache = env.server.managers.resources
            await clock.advance_until(lambda: not cache.is_idle(raylet.node_id), 0.1)
            job_id = b"\x07\x00\x00\x00"
            await add_job(env, job_id, jcid)
            await env.stubs.jobs.MarkJobFinished(Req.MarkJobFinishedRequest(job_id=job_id))
            await env.manager.settle()
            assert jcid in await env.clusters()
            raylet.load = None
            await clock.advance_until(lambda: cache.is_idle(raylet.node_id), 0.1)

            async def gone() -> bool:
                return jcid not in await env.clusters()

            await clock.advance_until(gone, 0.1)  # the periodic job-cluster GC
        finally:
            await env.close()


class TestPlacementGroups:
    async def test_a_jobs_group_is_placed_only_on_its_clusters_nodes(self, memory_env) -> None:
        """A job in an indivisible cluster: its SPREAD group lands on the cluster's nodes
        only, even with free nodes outside; a job in no cluster may use any node."""
        await memory_env.create("ind", {"4c8g": 2})
        members = set(memory_env.manager.registry.get("ind").members)
        job_id = b"\x07\x00\x00\x00"
        assert (await add_job(memory_env, job_id, "ind")).code == 0
        spec = common_pb2.PlacementGroupSpec(
            placement_group_id=b"\x01" * 18,
            strategy=common_pb2.SPREAD,
            creator_job_id=job_id,
            bundles=[common_pb2.Bundle(unit_resources={"CPU": 1})] * 4,
        )
        await memory_env.stubs.pgs.CreatePlacementGroup(
            Req.CreatePlacementGroupRequest(placement_group_spec=spec)
        )
        pgs = memory_env.server.managers.placement_groups
        created = gcs_pb2.PlacementGroupTableData.CREATED
        scheduler = memory_env.server.managers.pg_scheduler
        await scheduler.changes.until(lambda: pgs.groups[b"\x01" * 18].state == created)
        placed = {b.node_id.hex() for b in pgs.groups[b"\x01" * 18].bundles}
        assert placed == members
        for node_hex in members:
            assert len(memory_env.raylet(node_hex).committed) == 2
