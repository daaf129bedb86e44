"""Check-await-apply races in managers (issue 12, defect 3) and ambiguous store writes
(defect 5), on memory, SQLite and Redis.

Every store is wrapped in :class:`YieldingStore`, which gives the loop away around every
call, so the interleavings that broke the old managers happen on every run: the second
mutation always runs its check while the first one is awaiting its write.  Each test ends by
starting a second GcsServer on the same data and comparing it with the first one's memory
(memory and store must agree).
"""

from __future__ import annotations

import asyncio
import pathlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
import pytest

from gcs.base.errors import FailedPrecondition
from gcs.config import HealthCheckConfig, LoadPollConfig
from gcs.managers.lane import ResolvePolicy
from gcs.proto import autoscaler_pb2 as A
from gcs.proto import common_pb2, gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.server import GcsServer
from gcs.store import Store
from gcs.store.errors import StoreOutcomeUnknown
from gcs.store.memory import MemoryStore
from gcs.testing.stores import FaultyStore, UnsureStore, WriteFault, YieldingStore
from tests.conftest import Stubs, fast_config

ALIVE, DEAD = gcs_pb2.GcsNodeInfo.ALIVE, gcs_pb2.GcsNodeInfo.DEAD
Reason = common_pb2.NodeDeathInfo.Reason
# No health checks or load polls during a test: only the calls the test makes change state.
QUIET = fast_config(
    health=HealthCheckConfig(initial_delay_ms=3_600_000, period_ms=3_600_000),
    load_poll=LoadPollConfig(period_ms=3_600_000),
    node_instances_replenish_interval_ms=3_600_000,
    expired_job_clusters_gc_interval_ms=3_600_000,
)
NO_WAIT = ResolvePolicy(attempts=1)  # ask the store once; no backoff sleeps in tests


def WIDE(store: Store) -> Store:
    """Writes that stay in flight long enough for concurrent RPCs to arrive meanwhile."""
    return YieldingStore(store, yields=100)


def node_info(n: int, **fields: object) -> gcs_pb2.GcsNodeInfo:
    return gcs_pb2.GcsNodeInfo(
        node_id=bytes([n]) * 28,
        node_manager_address="127.0.0.1",
        node_manager_port=40000 + n,
        resources_total={"CPU": 1},
        state=ALIVE,
        **fields,  # type: ignore[arg-type]
    )


@dataclass
class Backend:
    """Handles on one backend's data; ``make()`` opens a new handle on the same data."""

    make: Callable[[], Store]
    opened: list[Store] = field(default_factory=list)
    servers: list[GcsServer] = field(default_factory=list)

    async def server(self, *, wrap: Callable[[Store], Store] = YieldingStore) -> GcsServer:
        store = self.make()
        await store.open()
        self.opened.append(store)
        server = GcsServer(QUIET, store=wrap(store), lane_policy=NO_WAIT)
        await server.start()
        self.servers.append(server)
        return server


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def backend(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> AsyncIterator[Backend]:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    if request.param == "memory":
        memory = MemoryStore()
        made = Backend(lambda: memory)
    elif request.param == "sqlite":
        from gcs.store.sql.store import SqlStore

        url = f"sqlite:///{tmp_path / 'gcs.db'}"
        made = Backend(lambda: SqlStore(url, namespace=namespace))
    else:
        from gcs.store.redis.store import RedisStore

        redis = request.getfixturevalue("redis_server")
        made = Backend(lambda: RedisStore(redis.url, namespace=namespace))
    try:
        yield made
    finally:
        for server in made.servers:
            await server.stop()
        for store in made.opened:
            await store.close()


def managers(server: GcsServer):  # type: ignore[no-untyped-def]
    assert server.managers is not None
    return server.managers


def node_states(server: GcsServer) -> dict[bytes, tuple[int, int]]:
    """node id -> (state, death reason), asserting no node is both alive and dead."""
    nodes = managers(server).nodes
    both = set(nodes.alive) & set(nodes.dead)
    assert not both, f"nodes listed both ALIVE and DEAD: {[n.hex() for n in both]}"
    return {n.node_id: (n.state, n.death_info.reason) for n in nodes.all_nodes()}


async def restarted(backend: Backend, first: GcsServer) -> GcsServer:
    """A second server on the same data (after the first one stopped)."""
    await first.stop()
    return await backend.server(wrap=lambda s: s)


async def rpc_stubs(server: GcsServer) -> tuple[grpc.aio.Channel, Stubs]:
    assert server.meta is not None
    channel = grpc.aio.insecure_channel(server.address)
    return channel, Stubs(channel, server.meta.cluster_id)


class TestUnregisterRace:
    async def test_five_concurrent_unregisters_are_one_death_and_four_no_ops(
        self, backend: Backend
    ) -> None:
        """Old code: 4 x KeyError at ``del self.alive[node_id]`` (INTERNAL on the wire)."""
        server = await backend.server()
        nodes = managers(server).nodes
        await nodes.register(node_info(1))
        info = common_pb2.NodeDeathInfo(reason=Reason.EXPECTED_TERMINATION, reason_message="bye")
        results = await asyncio.gather(
            *(nodes.unregister(node_info(1).node_id, info) for _ in range(5)),
            return_exceptions=True,
        )
        assert sorted(results, key=repr) == [False, False, False, False, True]
        before = node_states(server)
        assert before == {node_info(1).node_id: (DEAD, Reason.EXPECTED_TERMINATION)}
        assert node_states(await restarted(backend, server)) == before

    async def test_concurrent_unregister_rpcs_all_answer_ok(self, backend: Backend) -> None:
        """Over gRPC: five UnregisterNode at once all get OK (Ray: a dead id is a no-op)."""
        server = await backend.server(wrap=WIDE)
        channel, stubs = await rpc_stubs(server)
        async with channel:
            await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=node_info(2)))
            request = G.UnregisterNodeRequest(
                node_id=node_info(2).node_id,
                node_death_info=common_pb2.NodeDeathInfo(reason=Reason.EXPECTED_TERMINATION),
            )
            replies = await asyncio.gather(
                *(stubs.node_info.UnregisterNode(request) for _ in range(5)),
                return_exceptions=True,
            )
        errors = [r for r in replies if isinstance(r, BaseException)]
        assert not errors, errors
        assert node_states(server)[node_info(2).node_id][0] == DEAD


class TestRegisterUnregisterRace:
    async def test_one_consistent_state_in_memory_and_store(self, backend: Backend) -> None:
        """Unregister, then a re-register while its write is in flight.  Old code: the node
        ended in both the alive and the dead set, and the store said ALIVE.  Now the death
        applies first and the re-registration of a dead node is refused."""
        server = await backend.server()
        nodes = managers(server).nodes
        await nodes.register(node_info(3))
        info = common_pb2.NodeDeathInfo(reason=Reason.EXPECTED_TERMINATION)
        unregistered, registered = await asyncio.gather(
            nodes.unregister(node_info(3).node_id, info),
            nodes.register(node_info(3)),
            return_exceptions=True,
        )
        assert unregistered is True
        assert isinstance(registered, FailedPrecondition)
        before = node_states(server)
        assert before[node_info(3).node_id][0] == DEAD
        assert node_states(await restarted(backend, server)) == before

    async def test_register_then_unregister_of_a_new_node(self, backend: Backend) -> None:
        """An unregister arriving while the registration is being written applies after it
        (arrival order), not as a no-op against the state before it (old code: ignored, the
        node stayed ALIVE although both calls were acknowledged)."""
        server = await backend.server()
        nodes = managers(server).nodes
        info = common_pb2.NodeDeathInfo(reason=Reason.EXPECTED_TERMINATION)
        await asyncio.gather(
            nodes.register(node_info(4)), nodes.unregister(node_info(4).node_id, info)
        )
        before = node_states(server)
        assert before == {node_info(4).node_id: (DEAD, Reason.EXPECTED_TERMINATION)}
        assert node_states(await restarted(backend, server)) == before


class TestDeathRaces:
    async def test_health_death_racing_unregister(self, backend: Backend) -> None:
        """The raylet's own exit and the health checker's verdict at once: one death, with
        the reason of the first (old code: KeyError in the second, which the checker then
        retried, overwriting the recorded reason)."""
        server = await backend.server()
        nodes = managers(server).nodes
        await nodes.register(node_info(5))
        node_id = node_info(5).node_id
        exited = common_pb2.NodeDeathInfo(reason=Reason.EXPECTED_TERMINATION)
        results = await asyncio.gather(
            nodes.unregister(node_id, exited), nodes.fail_unhealthy(node_id)
        )
        assert results == [True, False]
        before = node_states(server)
        assert before == {node_id: (DEAD, Reason.EXPECTED_TERMINATION)}
        assert node_states(await restarted(backend, server)) == before

    async def test_health_death_racing_legacy_drain(self, backend: Backend) -> None:
        """Health death first, the legacy DrainNode's mark_dead while it is in flight."""
        server = await backend.server()
        nodes = managers(server).nodes
        await nodes.register(node_info(6))
        node_id = node_info(6).node_id
        results = await asyncio.gather(
            nodes.fail_unhealthy(node_id),
            nodes.mark_dead(node_id, Reason.EXPECTED_TERMINATION, "drained via DrainNode"),
        )
        assert results == [True, False]
        before = node_states(server)
        assert before == {node_id: (DEAD, Reason.UNEXPECTED_TERMINATION)}
        assert node_states(await restarted(backend, server)) == before

    @pytest.mark.parametrize("killer", ["unregister", "fail_unhealthy"])
    async def test_new_head_racing_the_old_heads_death(self, backend: Backend, killer: str) -> None:
        """A new head marks the old head dead while the old head is dying by another path
        (old code: KeyError in whichever death applied second)."""
        server = await backend.server()
        nodes = managers(server).nodes
        old, new = node_info(7, is_head_node=True), node_info(8, is_head_node=True)
        await nodes.register(old)
        if killer == "unregister":
            death = nodes.unregister(
                old.node_id, common_pb2.NodeDeathInfo(reason=Reason.EXPECTED_TERMINATION)
            )
        else:
            death = nodes.fail_unhealthy(old.node_id)
        await asyncio.gather(nodes.register(new), death)
        before = node_states(server)
        assert before[new.node_id][0] == ALIVE
        assert before[old.node_id] == (DEAD, Reason.UNEXPECTED_TERMINATION)
        assert len(nodes.dead) == 1
        assert node_states(await restarted(backend, server)) == before


class TestHealthCheckerDeath:
    async def test_checker_verdict_racing_unregister_is_a_no_op(self, backend: Backend) -> None:
        """The checker's last failed check lands while the raylet's UnregisterNode is being
        written: the checker's death is a no-op and the node leaves its rotation (old code:
        KeyError; the checker logged it and put the dead node back to be checked again)."""
        from gcs.base.clock import FakeClock
        from gcs.managers.health import HealthChecker
        from gcs.testing.fake_raylets import FakeRayletGateway

        server = await backend.server()
        nodes = managers(server).nodes
        node = node_info(12)
        await nodes.register(node)
        raylets = FakeRayletGateway(unreachable={node.node_id})
        raylets.hold()
        clock = FakeClock()
        checker = HealthChecker(
            nodes,
            raylets,
            clock,
            HealthCheckConfig(initial_delay_ms=0, failure_threshold=1),
        )
        checker.on_node_added(node)
        clock.advance(checker._period_s)  # past the jittered first check
        assert checker.tick() == 1

        async def verdict() -> None:
            await asyncio.sleep(0)
            raylets.release()
            await checker.settle()

        exited = common_pb2.NodeDeathInfo(reason=Reason.EXPECTED_TERMINATION)
        results = await asyncio.gather(nodes.unregister(node.node_id, exited), verdict())
        assert results[0] is True
        assert node.node_id not in checker._state
        before = node_states(server)
        assert before == {node.node_id: (DEAD, Reason.EXPECTED_TERMINATION)}
        assert node_states(await restarted(backend, server)) == before


class TestAutoscalingStateRace:
    async def test_highest_version_wins(self, backend: Backend) -> None:
        """v6 and v5 reported concurrently (v6 first): old code kept 5 (both passed the check
        before either applied).  Ray drops a report older than the current one."""
        server = await backend.server()
        autoscaler = managers(server).autoscaler
        results = await asyncio.gather(
            autoscaler.report_autoscaling_state(A.AutoscalingState(autoscaler_state_version=6)),
            autoscaler.report_autoscaling_state(A.AutoscalingState(autoscaler_state_version=5)),
        )
        assert results == [True, False]
        assert autoscaler.autoscaling_state.autoscaler_state_version == 6
        again = managers(await restarted(backend, server)).autoscaler
        assert again.autoscaling_state.autoscaler_state_version == 6

    async def test_over_grpc(self, backend: Backend) -> None:
        server = await backend.server(wrap=WIDE)
        channel, stubs = await rpc_stubs(server)
        async with channel:
            await asyncio.gather(
                *(
                    stubs.autoscaler.ReportAutoscalingState(
                        A.ReportAutoscalingStateRequest(
                            autoscaling_state=A.AutoscalingState(autoscaler_state_version=v)
                        )
                    )
                    for v in (6, 5, 4, 6, 5)
                )
            )
            status = await stubs.autoscaler.GetClusterStatus(A.GetClusterStatusRequest())
        assert status.autoscaling_state.autoscaler_state_version == 6


class TestJobAndPlacementGroupRaces:
    async def test_concurrent_finish_is_one_transition(self, backend: Backend) -> None:
        """Three MarkJobFinished at once: one transition (old code: three, each telling the
        finish listeners again)."""
        server = await backend.server()
        jobs = managers(server).jobs
        job_id = (1).to_bytes(4, "little")
        await jobs.add(gcs_pb2.JobTableData(job_id=job_id))
        results = await asyncio.gather(*(jobs.mark_finished(job_id) for _ in range(3)))
        assert sorted(results) == [False, False, True]
        again = managers(await restarted(backend, server)).jobs
        assert again.jobs[job_id].is_dead

    async def test_concurrent_creates_of_one_placement_group_are_one_write(
        self, backend: Backend
    ) -> None:
        """A client retrying CreatePlacementGroup while the first is being written: one
        creation (old code: each retry passed the "exists?" check and wrote again, bumping
        the table version the pending-gang caches key on once per retry)."""
        server = await backend.server()
        pgs = managers(server).placement_groups
        spec = common_pb2.PlacementGroupSpec(
            placement_group_id=b"\x05" * 18,
            bundles=[common_pb2.Bundle(unit_resources={"CPU": 1})],
        )
        version = pgs.version
        await asyncio.gather(*(pgs.create(spec) for _ in range(3)))
        assert pgs.version == version + 1
        again = managers(await restarted(backend, server)).placement_groups
        assert set(again.groups) == {spec.placement_group_id}


class TestAmbiguousWrites:
    """Defect 5: a write that landed although the store raised must not be missing from
    memory (it would reappear after a restart)."""

    async def test_landed_registration_is_acknowledged(self) -> None:
        """The store writes, then fails: the lane learns it landed and answers OK (old code:
        UNAVAILABLE, node absent from memory, present after a restart)."""
        memory = MemoryStore()
        faulty = FaultyStore(memory)
        backend = Backend(lambda: memory)
        try:
            server = await backend.server(wrap=lambda s: faulty)
            channel, stubs = await rpc_stubs(server)
            async with channel:
                faulty.fail_next(WriteFault.AFTER)
                await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=node_info(9)))
            before = node_states(server)
            assert before == {node_info(9).node_id: (ALIVE, 0)}
            assert node_states(await restarted(backend, server)) == before
        finally:
            for server in backend.servers:
                await server.stop()

    async def test_unresolved_death_is_applied_before_the_next_write(self) -> None:
        """UnregisterNode's write lands but the store cannot say so yet: the client gets
        UNAVAILABLE ("may have been applied") and memory still has the node alive; the next
        node mutation first learns the death landed and applies (and publishes) it."""
        memory = MemoryStore()
        unsure = UnsureStore(memory)
        backend = Backend(lambda: memory)
        try:
            server = await backend.server(wrap=lambda s: unsure)
            channel, stubs = await rpc_stubs(server)
            node_id = node_info(10).node_id
            async with channel:
                await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=node_info(10)))
                unsure.fail_next(WriteFault.AFTER)
                unsure.unsure = NO_WAIT.attempts
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stubs.node_info.UnregisterNode(G.UnregisterNodeRequest(node_id=node_id))
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "may have been applied" in err.value.details()
                assert managers(server).nodes.is_alive(node_id)  # not applied yet
                await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=node_info(11)))
            before = node_states(server)
            assert before[node_id][0] == DEAD and before[node_info(11).node_id][0] == ALIVE
            assert node_info(10).node_id not in managers(server).health._state
            assert node_states(await restarted(backend, server)) == before
        finally:
            for server in backend.servers:
                await server.stop()

    async def test_unresolved_vc_plan_commits_before_queued_node_events(self) -> None:
        """A VC write lands but the store cannot say so; a node registers meanwhile.  The
        node event waits behind the unresolved plan; the next VC mutation commits the plan,
        then the event, so the registry is valid and equals what a restart replays (old
        code: the plan was dropped from memory, and the cluster reappeared after a restart)."""
        memory = MemoryStore()
        unsure = UnsureStore(memory)
        backend = Backend(lambda: memory)
        try:
            server = await backend.server(wrap=lambda s: unsure)
            nodes, vc = managers(server).nodes, managers(server).virtual_clusters
            for n in (20, 21):
                await nodes.register(node_info(n, node_type_name="cpu"))
            unsure.fail_next(WriteFault.AFTER)
            unsure.unsure = NO_WAIT.attempts
            with pytest.raises(StoreOutcomeUnknown):
                await vc.create_or_update("vc1", False, {"cpu": 1}, 0)
            assert vc.registry.get("vc1") is None
            await nodes.register(node_info(22, node_type_name="cpu"))
            assert vc.registry.node(node_info(22).node_id.hex()) is None  # queued
            await vc.create_or_update("vc2", False, {"cpu": 1}, 0)
            registry = vc.registry
            assert registry.get("vc1") is not None and registry.get("vc2") is not None
            assert registry.node(node_info(22).node_id.hex()) is not None
            assert registry.invariant_violations() == []
            before = {c: set(registry.table_data(c).node_instances) for c in ("vc1", "vc2")}
            again = managers(await restarted(backend, server)).virtual_clusters.registry
            after = {c: set(again.table_data(c).node_instances) for c in ("vc1", "vc2")}
            assert after == before
        finally:
            for server in backend.servers:
                await server.stop()
