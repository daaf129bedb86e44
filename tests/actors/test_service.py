"""``ray.rpc.ActorInfoGcsService`` through a real GcsServer (fake raylets / core workers)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from gcs.base.clock import FakeClock
from gcs.config import HealthCheckConfig, LoadPollConfig
from gcs.proto import gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from gcs.testing.actors import FakeActorGateway
from tests.actors.harness import actor_spec, node_info
from tests.conftest import Stubs, fast_config

QUIET = fast_config(
    health=HealthCheckConfig(initial_delay_ms=3_600_000, period_ms=3_600_000),
    load_poll=LoadPollConfig(period_ms=3_600_000),
    node_instances_replenish_interval_ms=3_600_000,
    expired_job_clusters_gc_interval_ms=3_600_000,
)
ALIVE, DEAD = gcs_pb2.ActorTableData.ALIVE, gcs_pb2.ActorTableData.DEAD


class Cluster:
    def __init__(self, clock: FakeClock | None = None) -> None:
        self.store = MemoryStore()
        self.gateway = FakeActorGateway()
        self.clock = clock
        self.server: GcsServer | None = None
        self._channel: grpc.aio.Channel | None = None

    async def start(self) -> Stubs:
        self.server = GcsServer(
            QUIET, store=self.store, actor_gateway=self.gateway, clock=self.clock
        )
        await self.server.start()
        assert self.server.meta is not None
        self._channel = grpc.aio.insecure_channel(self.server.address)
        return Stubs(self._channel, self.server.meta.cluster_id)

    async def stop(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        if self.server is not None:
            await self.server.stop()


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        await c.stop()


class TestActorInfoService:
    async def test_named_detached_actor_lifecycle_over_the_wire(self, cluster: Cluster) -> None:
        stubs = await cluster.start()
        await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=node_info(1)))
        spec = actor_spec(1, name="keeper", namespace="app", detached=True)
        actor_id = spec.actor_creation_task_spec.actor_id
        reply = await stubs.actors.RegisterActor(G.RegisterActorRequest(task_spec=spec))
        assert reply.status.code == 0
        clash = actor_spec(2, name="keeper", namespace="app")
        reply = await stubs.actors.RegisterActor(G.RegisterActorRequest(task_spec=clash))
        assert reply.status.code == 20  # Ray's AlreadyExists, in the reply
        assert reply.status.message == (
            "Actor with name 'keeper' already exists in the namespace app"
        )
        created = await stubs.actors.CreateActor(G.CreateActorRequest(task_spec=spec))
        assert created.status.code == 0
        assert created.actor_address == cluster.gateway.pushes[0][0]

        named = await stubs.actors.GetNamedActorInfo(
            G.GetNamedActorInfoRequest(name="keeper", ray_namespace="app")
        )
        assert named.actor_table_data.state == ALIVE and named.task_spec == spec
        missing = await stubs.actors.GetNamedActorInfo(
            G.GetNamedActorInfoRequest(name="nope", ray_namespace="app")
        )
        assert missing.status.code == 17 and missing.status.message == (
            "Actor with name 'nope' was not found."
        )
        listed = await stubs.actors.ListNamedActors(G.ListNamedActorsRequest(ray_namespace="app"))
        assert [(n.ray_namespace, n.name) for n in listed.named_actors_list] == [("app", "keeper")]
        info = await stubs.actors.GetActorInfo(G.GetActorInfoRequest(actor_id=actor_id))
        assert info.actor_table_data.name == "keeper"
        every = await stubs.actors.GetAllActorInfo(G.GetAllActorInfoRequest(limit=10))
        assert every.total == 1 and len(every.actor_table_data) == 1

        killed = await stubs.actors.KillActorViaGcs(
            G.KillActorViaGcsRequest(actor_id=actor_id, force_kill=True, no_restart=True)
        )
        assert killed.status.code == 0
        info = await stubs.actors.GetActorInfo(G.GetActorInfoRequest(actor_id=actor_id))
        assert info.actor_table_data.state == DEAD
        unknown = await stubs.actors.KillActorViaGcs(
            G.KillActorViaGcsRequest(actor_id=b"\x05" * 16, no_restart=True)
        )
        assert unknown.status.code == 17

    async def test_detached_actor_survives_a_gcs_restart(self, cluster: Cluster) -> None:
        stubs = await cluster.start()
        await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=node_info(1)))
        spec = actor_spec(1, name="keeper", detached=True)
        await stubs.actors.RegisterActor(G.RegisterActorRequest(task_spec=spec))
        created = await stubs.actors.CreateActor(G.CreateActorRequest(task_spec=spec))
        await cluster.stop()

        stubs = await cluster.start()
        named = await stubs.actors.GetNamedActorInfo(
            G.GetNamedActorInfoRequest(name="keeper", ray_namespace="ns")
        )
        assert named.status.code == 0
        assert named.actor_table_data.state == ALIVE
        assert named.actor_table_data.address == created.actor_address

    async def test_a_finished_jobs_detached_actor_is_listed_by_default(
        self, cluster: Cluster
    ) -> None:
        """``show_dead_jobs=false`` (the default; ``ray list actors``) lists every actor the
        GCS holds, as Ray's does: a detached actor outlives the job that created it and is
        listed alive after it, the job's own actor listed dead."""
        stubs = await cluster.start()
        await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=node_info(1)))
        job_id = actor_spec(1).job_id
        await stubs.jobs.AddJob(G.AddJobRequest(data=gcs_pb2.JobTableData(job_id=job_id)))
        for spec in (actor_spec(1, name="keeper", detached=True), actor_spec(2)):
            await stubs.actors.RegisterActor(G.RegisterActorRequest(task_spec=spec))
            await stubs.actors.CreateActor(G.CreateActorRequest(task_spec=spec))
        await stubs.jobs.MarkJobFinished(G.MarkJobFinishedRequest(job_id=job_id))
        assert cluster.server is not None and cluster.server.managers is not None
        await cluster.server.managers.actors.settle()

        for show_dead_jobs in (False, True):
            every = await stubs.actors.GetAllActorInfo(
                G.GetAllActorInfoRequest(show_dead_jobs=show_dead_jobs)
            )
            states = {a.name: a.state for a in every.actor_table_data}
            assert states == {"keeper": ALIVE, "": DEAD}, (show_dead_jobs, states)

    async def test_a_finished_jobs_exports_go_with_its_last_detached_actor(
        self, cluster: Cluster
    ) -> None:
        """What a driver exported to namespace ``fun`` (remote functions, actor classes,
        setup hooks: ``<kind>:<job hex>:...``) is deleted once its job has finished and its
        detached actor is dead (Ray's test_advanced_9.py::test_function_table_gc_actor);
        another job's exports, and other keys, stay."""
        stubs = await cluster.start()
        await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=node_info(1)))
        job_id, other = actor_spec(1).job_id, b"\x07\x00\x00\x00"
        await stubs.jobs.AddJob(G.AddJobRequest(data=gcs_pb2.JobTableData(job_id=job_id)))
        keys = [
            f"{kind}:{job.hex()}:{n}".encode()
            for kind in ("RemoteFunction", "ActorClass", "FunctionsToRun")
            for job in (job_id, other)
            for n in range(2)
        ] + [f"RemoteFunction:{job_id.hex()}".encode()]  # not under the job's prefix
        for key in keys:
            await stubs.kv.InternalKVPut(
                G.InternalKVPutRequest(namespace=b"fun", key=key, value=b"pickled", overwrite=True)
            )
        spec = actor_spec(1, name="keeper", detached=True)
        await stubs.actors.RegisterActor(G.RegisterActorRequest(task_spec=spec))
        await stubs.actors.CreateActor(G.CreateActorRequest(task_spec=spec))
        await stubs.jobs.MarkJobFinished(G.MarkJobFinishedRequest(job_id=job_id))
        assert cluster.server is not None and cluster.server.managers is not None
        await cluster.server.managers.actors.settle()

        async def exported() -> set[bytes]:
            reply = await stubs.kv.InternalKVKeys(
                G.InternalKVKeysRequest(namespace=b"fun", prefix=b"")
            )
            return set(reply.results)

        assert await exported() == set(keys)  # the detached actor may still run them
        await stubs.actors.KillActorViaGcs(
            G.KillActorViaGcsRequest(
                actor_id=spec.actor_creation_task_spec.actor_id, no_restart=True
            )
        )
        await cluster.server.managers.actors.settle()
        assert await exported() == {key for key in keys if job_id.hex() not in key.decode()} | {
            f"RemoteFunction:{job_id.hex()}".encode()
        }

    async def test_a_finished_jobs_runtime_env_package_goes_with_its_last_detached_actor(
        self,
    ) -> None:
        """A job's ``working_dir`` package (``gcs://`` in internal KV, unpinned as Ray's
        driver leaves it with ``RAY_RUNTIME_ENV_URI_PIN_EXPIRATION_S=0``) stays while a
        detached actor the job created lives, and is deleted once it died."""
        clock = FakeClock()
        cluster = Cluster(clock)
        try:
            stubs = await cluster.start()
            await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=node_info(1)))
            spec = actor_spec(1, name="keeper", detached=True)
            uri = b"gcs://_ray_pkg_keeper.zip"
            await stubs.kv.InternalKVPut(G.InternalKVPutRequest(key=uri, value=b"zip"))
            job = gcs_pb2.JobTableData(job_id=spec.job_id)
            job.config.runtime_env_info.uris.working_dir_uri = uri.decode()
            await stubs.jobs.AddJob(G.AddJobRequest(data=job))
            await stubs.actors.RegisterActor(G.RegisterActorRequest(task_spec=spec))
            await stubs.actors.CreateActor(G.CreateActorRequest(task_spec=spec))
            await stubs.jobs.MarkJobFinished(G.MarkJobFinishedRequest(job_id=spec.job_id))
            assert cluster.server is not None and cluster.server.managers is not None
            await cluster.server.managers.actors.settle()

            async def stored() -> bool:
                got = await stubs.kv.InternalKVGet(G.InternalKVGetRequest(key=uri))
                return got.value == b"zip"

            await clock.run_for(5.0, step_s=1.0)  # five passes of the 1 s deleting loop
            assert await stored()  # the detached actor may still import from it
            await stubs.actors.KillActorViaGcs(
                G.KillActorViaGcsRequest(
                    actor_id=spec.actor_creation_task_spec.actor_id, no_restart=True
                )
            )
            await cluster.server.managers.actors.settle()

            async def gone() -> bool:
                return not await stored()

            await clock.advance_until(gone, 1.0)
        finally:
            await cluster.stop()

    async def test_actor_id_filter_counts_every_other_actor_as_filtered(
        self, cluster: Cluster
    ) -> None:
        """Ray's GetAllActorInfo runs the actor_id filter over every actor it holds, so
        ``num_filtered`` counts the others: Ray's state API (``list_actors(filters=
        [("actor_id", "=", ...)])``) checks ``total == len(actors) + num_filtered`` and
        reports truncation otherwise (Ray's test_implicit_resource.py)."""
        stubs = await cluster.start()
        for n in (1, 2, 3):
            await stubs.actors.RegisterActor(G.RegisterActorRequest(task_spec=actor_spec(n)))
        Filters = G.GetAllActorInfoRequest.Filters
        one = await stubs.actors.GetAllActorInfo(
            G.GetAllActorInfoRequest(filters=Filters(actor_id=b"\x02" * 16))
        )
        assert [a.actor_id for a in one.actor_table_data] == [b"\x02" * 16]
        assert (one.total, one.num_filtered) == (3, 2)
        none = await stubs.actors.GetAllActorInfo(
            G.GetAllActorInfoRequest(filters=Filters(actor_id=b"\x09" * 16))
        )
        assert (len(none.actor_table_data), none.total, none.num_filtered) == (0, 3, 3)
        other_job = await stubs.actors.GetAllActorInfo(
            G.GetAllActorInfoRequest(filters=Filters(actor_id=b"\x02" * 16, job_id=b"\x07" * 4))
        )
        assert (len(other_job.actor_table_data), other_job.num_filtered) == (0, 3)

    async def test_bad_requests_are_invalid_argument(self, cluster: Cluster) -> None:
        stubs = await cluster.start()
        spec = actor_spec(1)
        spec.actor_creation_task_spec.actor_id = b"short"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stubs.actors.RegisterActor(G.RegisterActorRequest(task_spec=spec))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "task_spec.actor_creation_task_spec.actor_id must be 16 bytes" in (
            err.value.details() or ""
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stubs.actors.GetAllActorInfo(
                G.GetAllActorInfoRequest(filters=G.GetAllActorInfoRequest.Filters(job_id=b"x"))
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
