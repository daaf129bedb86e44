"""Ray 2.60 GCS behaviours that Ray's own test files check (and that we missed):

* ``test_namespace.py::test_detached_warning``: a named detached actor registered in an
  anonymous namespace gets a ``detached_actor_anonymous_namespace`` warning on the error
  channel, keyed by its job;
* ``test_placement_group_2.py::test_automatic_cleanup_*``: the placement groups an actor
  created are removed (their bundles returned) once the actor died *or restarted* and its
  job is dead, in either order; detached groups stay;
* ``test_namespace.py::test_placement_groups``: the room of a group removed before its
  raylet ever reported it (commit and return between two reports) is placeable again.
"""

from __future__ import annotations

import asyncio

import pytest

from gcs.base.clock import FakeClock, now_ms
from gcs.base.errors import AlreadyExists
from gcs.config import RequestLimits
from gcs.managers.actors import states
from gcs.managers.actors.driver_warnings import (
    DETACHED_ACTOR_ANONYMOUS_NAMESPACE,
    is_anonymous_namespace,
)
from gcs.managers.jobs import JobManager
from gcs.managers.placement_groups import PG, STATS
from gcs.policy.placement.policy import BundleDemand, GroupRequest, NodeView, Outcome, place_groups
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2
from gcs.services.actors import ActorInfoServicer
from gcs.store.memory import MemoryStore
from gcs.testing.stores import FaultyStore, WriteFault
from tests.actors.harness import JOB, Harness, actor_spec, turns_until
from tests.placement.test_manager import Gcs, make_gcs, node_id, pg_id, spec

ANONYMOUS = "5d2a7c00-5fef-4167-b0cb-540a6aaf4e0f"
ACTOR_A = b"\x0a" * 16


class TestDetachedActorInAnonymousNamespace:
    async def test_named_detached_actor_there_is_warned_to_its_job(self) -> None:
        h = await Harness().start(1)
        await h.actors.register(actor_spec(1, name="Pinger", namespace=ANONYMOUS, detached=True))
        ((key, error),) = h.errors
        assert key == JOB.hex().encode()
        assert error.type == DETACHED_ACTOR_ANONYMOUS_NAMESPACE
        assert error.job_id == JOB
        assert error.error_message == (
            "It looks like you're creating a detached actor in an anonymous namespace. In "
            "order to access this actor in the future, you will need to explicitly connect to "
            f'this namespace with ray.init(namespace="{ANONYMOUS}", ...)'
        )
        assert error.timestamp == now_ms(h.clock)

    async def test_no_warning_when_it_can_be_found_again_or_is_not_detached(self) -> None:
        h = await Harness().start(1)
        await h.actors.register(actor_spec(1, name="a", namespace="team", detached=True))
        await h.actors.register(actor_spec(2, name="b", namespace=ANONYMOUS))
        await h.actors.register(actor_spec(3, namespace=ANONYMOUS, detached=True))
        assert h.errors == []

    async def test_a_refused_name_warns_nothing(self) -> None:
        h = await Harness().start(1)
        await h.actors.register(actor_spec(1, name="p", namespace=ANONYMOUS, detached=True))
        with pytest.raises(AlreadyExists):
            await h.actors.register(actor_spec(2, name="p", namespace=ANONYMOUS, detached=True))
        assert len(h.errors) == 1

    def test_anonymous_means_rays_uuid_form(self) -> None:
        assert is_anonymous_namespace(ANONYMOUS)
        assert is_anonymous_namespace(ANONYMOUS.upper())
        assert not is_anonymous_namespace("namespace")
        assert not is_anonymous_namespace(ANONYMOUS.replace("-", ""))
        assert not is_anonymous_namespace(ANONYMOUS + "x")


class TestActorDeathReachesPlacementGroups:
    async def test_death_and_restart_are_both_told(self) -> None:
        """Ray's RestartActor and DestroyActor both clean the actor's groups."""
        h = await Harness().start(1)
        actor = await h.create(actor_spec(1, max_restarts=1))
        h.worker_failure(actor.address)
        await h.actors.settle()
        assert h.actors.get(actor.actor_id).num_restarts == 1
        assert h.told_dead == [actor.actor_id]
        await h.actors.kill(actor.actor_id, force_kill=True, no_restart=True)
        await h.actors.settle()
        assert h.told_dead == [actor.actor_id, actor.actor_id]
        assert h.actors.get(actor.actor_id).state == states.DEAD


def _actor_group(n: int, *, detached: bool = False) -> common_pb2.PlacementGroupSpec:
    return spec(n, common_pb2.PACK, 1, creator_actor_id=ACTOR_A, is_detached=detached)


async def _one_node_gcs(cpus: float = 4) -> Gcs:
    """The placement-group managers over fake raylets, one node ``a``, job ``JOB`` running."""
    store = MemoryStore()
    await store.open()
    gcs = await make_gcs(store)
    await gcs.add_node("a", cpus=cpus)
    await gcs.jobs.add(gcs_pb2.JobTableData(job_id=JOB))
    return gcs


class TestCreatorActorDead:
    async def test_job_dead_then_actor_dead_removes_and_returns_the_bundles(self) -> None:
        gcs = await _one_node_gcs()
        await gcs.pgs.create(_actor_group(1))
        await gcs.place()
        await gcs.jobs.mark_finished(JOB)
        await gcs.scheduler.settle()
        assert gcs.pgs.groups[pg_id(1)].state == PG.CREATED  # its actor still lives
        assert gcs.pgs.groups[pg_id(1)].creator_job_dead
        assert await gcs.pgs.creator_actor_dead(ACTOR_A) == [pg_id(1)]
        await gcs.scheduler.settle()
        assert gcs.pgs.groups[pg_id(1)].state == PG.REMOVED
        assert gcs.raylets.bundles[node_id("a")] == {}

    async def test_actor_dead_then_job_dead_removes_it(self) -> None:
        gcs = await _one_node_gcs()
        await gcs.pgs.create(_actor_group(1))
        await gcs.place()
        assert await gcs.pgs.creator_actor_dead(ACTOR_A) == []
        assert gcs.pgs.groups[pg_id(1)].creator_actor_dead
        assert gcs.pgs.groups[pg_id(1)].state == PG.CREATED
        await gcs.jobs.mark_finished(JOB)
        await gcs.scheduler.settle()
        assert gcs.pgs.groups[pg_id(1)].state == PG.REMOVED

    async def test_a_detached_actors_group_goes_with_the_actor(self) -> None:
        """The core worker marks a group created by a detached actor ``creator_job_dead``
        (the actor outlives its job): the actor's death or restart removes it at once."""
        gcs = await _one_node_gcs()
        await gcs.pgs.create(
            spec(1, common_pb2.PACK, 1, creator_actor_id=ACTOR_A, creator_job_dead=True)
        )
        await gcs.place()
        assert gcs.pgs.groups[pg_id(1)].creator_job_dead
        assert await gcs.pgs.creator_actor_dead(ACTOR_A) == [pg_id(1)]

    async def test_detached_groups_and_other_actors_groups_stay(self) -> None:
        gcs = await _one_node_gcs(cpus=8)
        await gcs.pgs.create(_actor_group(1, detached=True))
        await gcs.pgs.create(spec(2, common_pb2.PACK, 1, creator_actor_id=b"\x0b" * 16))
        await gcs.place()
        await gcs.jobs.mark_finished(JOB)
        assert await gcs.pgs.creator_actor_dead(ACTOR_A) == []
        assert gcs.pgs.groups[pg_id(1)].state == PG.CREATED
        assert gcs.pgs.groups[pg_id(2)].state == PG.CREATED
        assert not gcs.pgs.groups[pg_id(2)].creator_actor_dead


class TestRemovedGroupsRoom:
    async def test_room_of_a_group_removed_before_any_report_is_placeable(self) -> None:
        """One CPU: a group placed and removed while the raylet sent no new view (its view
        after the return equals the one before the commit) must not hold the CPU forever in
        the scheduler's reservations."""
        store = MemoryStore()
        await store.open()
        gcs = await make_gcs(store)
        await gcs.add_node("a", cpus=1)
        await gcs.pgs.create(spec(1, common_pb2.PACK, 1))
        await gcs.place()
        assert gcs.pgs.groups[pg_id(1)].state == PG.CREATED
        await gcs.pgs.remove(pg_id(1))
        await gcs.scheduler.settle()
        await gcs.pgs.create(spec(2, common_pb2.PACK, 1))
        (result,) = await gcs.scheduler.place_once()
        assert result.outcome is Outcome.PLACED


class TestLookupsSeeWritesSentBefore:
    """``ray.kill`` sends ``KillActorViaGcs`` without waiting; Ray's GCS answers the
    ``list_named_actors`` / ``get_actor`` that follows after it
    (``test_list_actors_3.py::test_list_named_actors_ray_kill``)."""

    async def test_name_lookups_wait_for_a_kill_being_applied(self) -> None:
        store = FaultyStore(MemoryStore())
        h = await Harness(store=store).start(1)
        actor = await h.create(actor_spec(1, name="hi", namespace="ns", max_restarts=-1))
        servicer = ActorInfoServicer(h.actors, limits=RequestLimits())
        store.fail_next(WriteFault.STALL)
        kill = asyncio.create_task(
            servicer.KillActorViaGcs(
                gcs_service_pb2.KillActorViaGcsRequest(
                    actor_id=actor.actor_id, force_kill=True, no_restart=True
                ),
                None,
            )
        )
        await turns_until(lambda: store.stalled == 1)  # the kill holds the lane, stalled
        listed = asyncio.create_task(
            servicer.ListNamedActors(
                gcs_service_pb2.ListNamedActorsRequest(ray_namespace="ns"), None
            )
        )
        named = asyncio.create_task(
            servicer.GetNamedActorInfo(
                gcs_service_pb2.GetNamedActorInfoRequest(name="hi", ray_namespace="ns"), None
            )
        )
        for _ in range(20):
            await asyncio.sleep(0)
        assert not listed.done() and not named.done()
        store.release()
        await kill
        assert list((await listed).named_actors_list) == []
        assert (await named).status.code != 0  # NotFound: the name is free

    async def test_lookups_do_not_wait_when_nothing_is_applied(self) -> None:
        h = await Harness().start(1)
        await h.create(actor_spec(1, name="hi", namespace="ns"))
        servicer = ActorInfoServicer(h.actors, limits=RequestLimits())
        reply = await servicer.ListNamedActors(
            gcs_service_pb2.ListNamedActorsRequest(ray_namespace="ns"), None
        )
        assert [a.name for a in reply.named_actors_list] == ["hi"]


class TestPlacementGroupStatsAndRemoval:
    """``test_placement_group_4.py``: ``placement_group_table()`` shows each group's
    scheduling attempts and why it waits (``NO_RESOURCES`` / ``INFEASIBLE``), and removing
    an unknown group is a no-op."""

    async def test_attempts_and_outcomes_are_shown_then_kept_with_the_created_group(
        self,
    ) -> None:
        gcs = await _one_node_gcs(cpus=1)
        await gcs.pgs.create(spec(1, common_pb2.PACK, 1))
        await gcs.pgs.create(spec(2, common_pb2.PACK, 1))
        await gcs.pgs.create(spec(3, common_pb2.PACK, 8))
        gcs.clock.advance(0.5)
        await gcs.place()
        created = gcs.pgs.get(pg_id(1))
        assert created is not None and created.state == PG.CREATED
        assert created.stats.scheduling_attempt == 1
        assert created.stats.scheduling_state == STATS.FINISHED
        assert created.stats.end_to_end_creation_latency_us == 500_000
        waiting = gcs.pgs.get(pg_id(2))
        assert waiting is not None
        assert (waiting.stats.scheduling_attempt, waiting.stats.scheduling_state) == (
            1,
            STATS.NO_RESOURCES,
        )
        never = gcs.pgs.get(pg_id(3))
        assert never is not None and never.stats.scheduling_state == STATS.INFEASIBLE
        assert gcs.pgs.groups[pg_id(2)].stats.scheduling_attempt == 0  # memory only

    async def test_removing_an_unknown_group_is_a_no_op(self) -> None:
        gcs = await _one_node_gcs()
        await gcs.pgs.remove(b"\x42" * 18)
        await gcs.pgs.remove(b"\x42" * 18)
        assert gcs.pgs.groups == {}


class TestStrictPackNodeChoice:
    def test_strict_pack_takes_the_node_left_emptiest_as_ray_does(self) -> None:
        """``test_placement_group_5.py::test_placement_group_strict_pack_soft_target_node_id``:
        {CPU: 2} x 2 on an 8-CPU head and a 4-CPU worker goes to the head (Ray's
        ``LeastResourceScorer``: 4/8 left beats 0/4), not to the tighter fit."""
        head = NodeView(b"h" * 28, {"CPU": 8.0}, {"CPU": 8.0})
        small = NodeView(b"s" * 28, {"CPU": 2.0}, {"CPU": 2.0})
        worker = NodeView(b"w" * 28, {"CPU": 4.0}, {"CPU": 4.0})
        group = GroupRequest(
            pg_id(1),
            common_pb2.STRICT_PACK,
            (BundleDemand(0, {"CPU": 2.0}), BundleDemand(1, {"CPU": 2.0})),
        )
        (result,) = place_groups([group], [small, worker, head])
        assert result.outcome is Outcome.PLACED
        assert set(result.assignment.values()) == {head.node_id}


class TestJobTimes:
    """``test_job.py::test_job_observability``: ``ray._private.state.jobs()`` shows
    ``Timestamp == StartTime`` for a running job and ``Timestamp == EndTime`` for a
    finished one.  Ray's GcsJobManager sets ``start_time`` and ``timestamp`` to the GCS's
    clock when the job is added (over what the driver sent) and ``end_time`` and
    ``timestamp`` when it is marked finished."""

    async def test_added_then_finished_job_times_are_the_gcs_clock(self) -> None:
        clock = FakeClock()
        jobs = JobManager(MemoryStore(), clock)
        await jobs.add(gcs_pb2.JobTableData(job_id=JOB, start_time=5, timestamp=7))
        added = jobs.jobs[JOB]
        assert added.start_time == added.timestamp == now_ms(clock) > 0
        assert added.end_time == 0
        clock.advance(2.5)
        assert await jobs.mark_finished(JOB)
        finished = jobs.jobs[JOB]
        assert finished.end_time == finished.timestamp == now_ms(clock)
        assert finished.start_time == added.start_time
        assert finished.end_time - finished.start_time == 2_500
