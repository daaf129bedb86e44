"""The actor manager with fake raylets / core workers: creation, restarts, deaths, names."""

from __future__ import annotations

import asyncio

import pytest

from gcs.base.errors import AlreadyExists, FailedPrecondition, NotFound, RayletUnreachable
from gcs.managers.actors import (
    CREATION_EXIT_REPORT_GRACE_S,
    TABLE_ACTOR,
    TABLE_ACTOR_TASK_SPEC,
    states,
)
from gcs.managers.actors.scheduler import lease_request, pin_to_node
from gcs.proto import common_pb2, core_worker_pb2, gcs_pb2, node_manager_pb2
from gcs.store import WriteBatch
from gcs.store.base import TABLE_JOB
from tests.actors.harness import (
    DRIVER,
    JOB,
    Actor,
    Harness,
    actor_spec,
    node_id,
    node_info,
    turns_until,
)

Reason = common_pb2.ActorDiedErrorContext.Reason
NodeReason = common_pb2.NodeDeathInfo.Reason


def spillback_to(n: int) -> node_manager_pb2.RequestWorkerLeaseReply:
    """A raylet's answer sending the lease on to node ``n``'s raylet."""
    spill = node_manager_pb2.RequestWorkerLeaseReply()
    spill.retry_at_raylet_address.CopyFrom(
        common_pb2.Address(node_id=node_id(n), ip_address="127.0.0.2", port=40000 + n)
    )
    return spill


def in_bundle(pg_id: bytes, index: int) -> common_pb2.SchedulingStrategy:
    strategy = common_pb2.SchedulingStrategy()
    strategy.placement_group_scheduling_strategy.placement_group_id = pg_id
    strategy.placement_group_scheduling_strategy.placement_group_bundle_index = index
    return strategy


def soft_affinity(n: int) -> common_pb2.SchedulingStrategy:
    strategy = common_pb2.SchedulingStrategy()
    strategy.node_affinity_scheduling_strategy.node_id = node_id(n)
    strategy.node_affinity_scheduling_strategy.soft = True
    return strategy


class TestCreation:
    async def test_actor_becomes_alive_on_the_leased_worker(self) -> None:
        """RegisterActor then CreateActor: a lease at a raylet, PushTask of the creation
        task to the leased worker, ALIVE with its address; each state is published."""
        h = await Harness().start(1)
        spec = actor_spec(1)
        actor = await h.create(spec)
        assert actor.state == states.ALIVE
        (lease,) = h.gateway.leases
        assert lease.node_id == node_id(1) and lease.address == "127.0.0.2:40001"
        lease_spec = lease.request.lease_spec
        assert lease_spec.actor_id == spec.actor_creation_task_spec.actor_id
        assert lease_spec.type == common_pb2.ACTOR_CREATION_TASK
        assert dict(lease_spec.required_resources) == {"CPU": 1}
        assert len(lease_spec.lease_id) == 32
        ((worker, push),) = h.gateway.pushes
        assert push.intended_worker_id == worker.worker_id
        assert push.task_spec == spec
        assert actor.address == worker and actor.node_id == node_id(1)
        assert actor.pid > 0 and actor.class_name == "Actor1"
        assert h.states(actor.actor_id) == ["DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE"]

    async def test_persisted_rows_are_the_actor_and_its_spec(self) -> None:
        h = await Harness().start(1)
        spec = actor_spec(1)
        actor = await h.create(spec)
        row = await h.store.get(TABLE_ACTOR, actor.actor_id)
        assert row is not None and Actor.FromString(row) == actor
        raw_spec = await h.store.get(TABLE_ACTOR_TASK_SPEC, actor.actor_id)
        assert raw_spec is not None and common_pb2.TaskSpec.FromString(raw_spec) == spec

    async def test_register_twice_is_idempotent_and_create_twice_answers_both(self) -> None:
        h = await Harness().start(1)
        spec = actor_spec(1)
        await h.actors.register(spec)
        await h.actors.register(spec)
        first, second = await asyncio.gather(h.actors.create(spec), h.actors.create(spec))
        assert first.actor_address == second.actor_address
        assert len(h.gateway.pushes) == 1

    async def test_no_node_fits_the_lease_queues_at_the_owners_raylet(self) -> None:
        """No node has 8 CPUs: the lease waits at the owner's raylet (which reports it as
        demand for an autoscaler) and follows the spillback once a node that fits joined."""
        h = await Harness().start(1)
        gate = h.gateway.lease_gate[node_id(1)] = asyncio.Event()
        spec = actor_spec(1, cpus=8)
        await h.actors.register(spec)
        creating = asyncio.ensure_future(h.actors.create(spec))
        await h.gateway.changes.until(lambda: len(h.gateway.leases) == 1)
        queued = h.gateway.leases[0]
        assert queued.node_id == node_id(1)
        assert dict(queued.request.lease_spec.required_resources) == {"CPU": 8}
        await h.nodes.register(node_info(2, cpus=8))
        spill = spillback_to(2)
        h.gateway.lease_script[node_id(1)].append(spill)
        gate.set()
        reply = await asyncio.wait_for(creating, 10)
        assert reply.actor_address.node_id == node_id(2)

    async def test_spillback_leases_again_at_the_named_raylet(self) -> None:
        h = await Harness().start(1, 2)
        spill = spillback_to(2)
        h.gateway.lease_script[node_id(1)].append(spill)
        actor = await h.create(actor_spec(1))
        assert [c.node_id for c in h.gateway.leases] == [node_id(1), node_id(2)]
        assert h.gateway.leases[1].address == "127.0.0.2:40002"
        assert actor.node_id == node_id(2)

    async def test_a_virtual_cluster_actor_is_leased_with_hard_affinity_to_the_chosen_node(
        self,
    ) -> None:
        """A Ray raylet re-decides SPREAD / DEFAULT itself and may spill the lease to any
        node; pinned to the node the policy chose inside the job's cluster, it cannot."""
        h = await Harness(virtual_cluster=frozenset({node_id(2)})).start(1, 2)
        spread = common_pb2.SchedulingStrategy()
        spread.spread_scheduling_strategy.SetInParent()
        actor = await h.create(actor_spec(1, strategy=spread))
        assert actor.node_id == node_id(2)
        (lease,) = h.gateway.leases
        affinity = lease.request.lease_spec.scheduling_strategy.node_affinity_scheduling_strategy
        assert lease.node_id == node_id(2)
        assert affinity.node_id == node_id(2) and not affinity.soft

    async def test_a_spillback_outside_the_virtual_cluster_is_not_followed(self) -> None:
        h = await Harness(virtual_cluster=frozenset({node_id(2)})).start(1, 2)
        spill = spillback_to(1)
        h.gateway.lease_script[node_id(2)].append(spill)
        actor = await h.create(actor_spec(1))
        assert [c.node_id for c in h.gateway.leases] == [node_id(2), node_id(2)]
        assert actor.node_id == node_id(2)

    async def test_a_placement_group_lease_keeps_its_strategy_in_a_virtual_cluster(self) -> None:
        request = lease_request(actor_spec(1, strategy=in_bundle(b"\x07" * 18, 0)))
        pin_to_node(request, node_id(2))
        assert request.lease_spec.scheduling_strategy == in_bundle(b"\x07" * 18, 0)

    async def test_a_lease_without_the_worker_host_uses_the_raylets(self) -> None:
        """Ray 2.60 raylets grant with the worker's port and id only."""
        h = await Harness().start(1)
        bare = node_manager_pb2.RequestWorkerLeaseReply(worker_pid=7)
        bare.worker_address.port = 30001
        bare.worker_address.worker_id = b"\x0a" * 28
        h.gateway.lease_script[node_id(1)].append(bare)
        actor = await h.create(actor_spec(1))
        assert actor.address == common_pb2.Address(
            node_id=node_id(1), ip_address="127.0.0.2", port=30001, worker_id=b"\x0a" * 28
        )
        assert h.gateway.pushes[0][0] == actor.address and actor.pid == 7

    async def test_rejection_or_unreachable_raylet_moves_to_another_node(self) -> None:
        h = await Harness().start(1, 2)
        h.gateway.lease_script[node_id(1)].append(
            node_manager_pb2.RequestWorkerLeaseReply(rejected=True)
        )
        h.gateway.lease_script[node_id(1)].append(RayletUnreachable(node_id(1), "refused"))
        actor = await h.create(actor_spec(1))
        assert actor.node_id == node_id(2)
        other = await h.create(actor_spec(2))
        assert other.state == states.ALIVE

    async def test_constructor_error_answers_create_with_creation_task_error_at_once(
        self,
    ) -> None:
        """As Ray's GCS: ``CreateActor`` answers CreationTaskError (16) with the worker's
        error text as soon as the push reply says the constructor raised (the owner then
        records the creation task as TASK_EXECUTION_EXCEPTION with that text; a cancelled
        reply made it a WORKER_DIED with no message: Ray's test_exit_observability);
        the worker's exit report then makes the actor DEAD with the whole exception (the
        serialized form the caller rebuilds its error from), never restarted."""
        h = await Harness().start(1)
        h.gateway.push_script.append(
            core_worker_pb2.PushTaskReply(
                is_application_error=True,
                task_execution_error="boom",
                borrowed_refs=[common_pb2.ObjectReferenceCount(has_local_ref=True)],
            )
        )
        spec = actor_spec(1, max_restarts=3)
        await h.actors.register(spec)
        create = asyncio.create_task(h.actors.create(spec))
        await turns_until(create.done)  # answered with no exit report yet
        reply = create.result()
        ((worker, _push),) = h.gateway.pushes
        assert reply.status.code == 16 and reply.status.message == "boom"
        assert reply.actor_address == worker and len(reply.borrowed_refs) == 1
        actor_id = spec.actor_creation_task_spec.actor_id
        assert h.actors.get(actor_id).state != states.DEAD
        exception = common_pb2.RayException(
            language=common_pb2.PYTHON,
            serialized_exception=b"pickled RayTaskError",
            formatted_exception_string="boom",
        )
        failure = gcs_pb2.WorkerTableData(
            worker_address=worker,
            exit_type=common_pb2.USER_ERROR,
            creation_task_exception=exception,
        )
        for listener in h.worker_events:
            listener.on_worker_dead(failure)
        await turns_until(lambda: h.actors.get(actor_id).state == states.DEAD)
        actor = h.actors.get(actor_id)
        assert actor.num_restarts == 0
        assert actor.death_cause.creation_task_failure_context == exception

    async def test_constructor_error_without_an_exit_report_dies_with_the_text(self) -> None:
        h = await Harness().start(1)
        h.gateway.push_script.append(
            core_worker_pb2.PushTaskReply(is_application_error=True, task_execution_error="boom")
        )
        spec = actor_spec(1)
        await h.actors.register(spec)
        create = asyncio.create_task(h.actors.create(spec))
        await turns_until(create.done)
        assert create.result().status.code == 16
        actor_id = spec.actor_creation_task_spec.actor_id
        await turns_until(lambda: h.clock.sleepers > 0)
        h.clock.advance(CREATION_EXIT_REPORT_GRACE_S)
        await turns_until(lambda: h.actors.get(actor_id).state == states.DEAD)
        cause = h.actors.get(actor_id).death_cause.creation_task_failure_context
        assert cause.formatted_exception_string == "boom" and not cause.serialized_exception

    async def test_unreachable_worker_is_leased_again(self) -> None:
        from gcs.base.errors import WorkerUnreachable

        h = await Harness().start(1)
        h.gateway.push_script.append(WorkerUnreachable(b"w", "gone"))
        actor = await h.create(actor_spec(1))
        assert len(h.gateway.leases) == 2 and actor.address == h.gateway.pushes[1][0]

    async def test_hard_affinity_to_a_dead_node_is_unschedulable(self) -> None:
        h = await Harness().start(1)
        strategy = common_pb2.SchedulingStrategy()
        strategy.node_affinity_scheduling_strategy.node_id = node_id(7)
        spec = actor_spec(1, strategy=strategy)
        await h.actors.register(spec)
        reply = await h.actors.create(spec)
        assert reply.status.code == 19
        assert "is not alive" in reply.death_cause.actor_unschedulable_context.error_message

    async def test_create_of_an_unknown_actor_fails(self) -> None:
        h = await Harness().start(1)
        with pytest.raises(FailedPrecondition, match="Actor may be already destroyed"):
            await h.actors.create(actor_spec(1))


class TestNames:
    async def test_a_taken_name_is_refused_with_rays_message(self) -> None:
        h = await Harness().start(1)
        await h.create(actor_spec(1, name="counter", namespace="ns"))
        with pytest.raises(AlreadyExists) as err:
            await h.actors.register(actor_spec(2, name="counter", namespace="ns"))
        assert err.value.message == "Actor with name 'counter' already exists in the namespace ns"
        await h.actors.register(actor_spec(3, name="counter", namespace="other"))
        assert h.actors.list_named("", all_namespaces=True) == [
            ("ns", "counter"),
            ("other", "counter"),
        ]
        assert h.actors.list_named("ns", all_namespaces=False) == [("ns", "counter")]

    async def test_the_name_is_freed_when_the_actor_dies(self) -> None:
        h = await Harness().start(1)
        first = await h.create(actor_spec(1, name="a"))
        assert h.actors.get_named("a", "ns").actor_id == first.actor_id
        await h.actors.kill(first.actor_id, force_kill=True, no_restart=True)
        with pytest.raises(NotFound, match=r"Actor with name 'a' was not found\."):
            h.actors.get_named("a", "ns")
        second = await h.create(actor_spec(2, name="a"))
        assert h.actors.get_named("a", "ns").actor_id == second.actor_id


class TestRestarts:
    async def test_worker_death_restarts_until_max_restarts_then_dead(self) -> None:
        h = await Harness().start(1)
        actor = await h.create(actor_spec(1, max_restarts=2))
        actor_id = actor.actor_id
        for expected in (1, 2):
            h.worker_failure(h.actors.get(actor_id).address)
            await h.until(
                lambda n=expected: (
                    h.actors.get(actor_id).state == states.ALIVE
                    and h.actors.get(actor_id).num_restarts == n
                )
            )
        h.worker_failure(h.actors.get(actor_id).address)
        await h.until(lambda: h.actors.get(actor_id).state == states.DEAD)
        dead = h.actors.get(actor_id)
        assert dead.num_restarts == 2
        ctx = dead.death_cause.actor_died_error_context
        assert ctx.reason == Reason.WORKER_DIED
        assert ctx.error_message.startswith(
            "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR"
        )
        assert h.states(actor_id).count("RESTARTING") == 2
        assert len(dead.previous_incarnations) == 2

    async def test_unlimited_restarts(self) -> None:
        h = await Harness().start(1)
        actor_id = (await h.create(actor_spec(1, max_restarts=-1))).actor_id
        for n in range(1, 6):
            h.worker_failure(h.actors.get(actor_id).address)
            await h.until(
                lambda n=n: (
                    h.actors.get(actor_id).state == states.ALIVE
                    and h.actors.get(actor_id).num_restarts == n
                )
            )

    async def test_intended_exit_is_not_restarted(self) -> None:
        h = await Harness().start(1)
        actor_id = (await h.create(actor_spec(1, max_restarts=5))).actor_id
        h.worker_failure(h.actors.get(actor_id).address, common_pb2.INTENDED_USER_EXIT)
        await h.until(lambda: h.actors.get(actor_id).state == states.DEAD)
        assert h.actors.get(actor_id).num_restarts == 0

    async def test_worker_dying_during_creation_restarts_the_creation(self) -> None:
        h = await Harness().start(1)
        h.gateway.push_gate = asyncio.Event()
        spec = actor_spec(1, max_restarts=1)
        await h.actors.register(spec)
        creating = asyncio.ensure_future(h.actors.create(spec))
        await h.gateway.changes.until(lambda: len(h.gateway.pushes) == 1)
        leased = h.gateway.pushes[0][0]
        h.worker_failure(leased)
        await h.gateway.changes.until(lambda: len(h.gateway.pushes) == 2)
        h.gateway.push_gate.set()
        reply = await asyncio.wait_for(creating, 10)
        assert reply.actor_address == h.gateway.pushes[1][0]

    async def test_node_death_restarts_elsewhere_and_kills_actors_owned_there(self) -> None:
        h = await Harness().start(1, 2)
        strategy = soft_affinity(2)
        on_two = await h.create(actor_spec(1, max_restarts=1, strategy=strategy, owner_node=1))
        owned_on_two = await h.create(actor_spec(2, owner_node=2, owner=b"\x02" * 28))
        detached_owned_on_two = await h.create(
            actor_spec(3, owner_node=2, owner=b"\x02" * 28, detached=True, max_restarts=1)
        )
        await h.nodes.mark_dead(node_id(2), NodeReason.UNEXPECTED_TERMINATION, "gone")
        await h.until(
            lambda: (
                h.actors.get(on_two.actor_id).state == states.ALIVE
                and h.actors.get(on_two.actor_id).node_id == node_id(1)
            )
        )
        restarted = h.actors.get(on_two.actor_id)
        assert restarted.num_restarts == 1
        assert h.actors.get(owned_on_two.actor_id).state == states.DEAD
        ctx = h.actors.get(owned_on_two.actor_id).death_cause.actor_died_error_context
        assert ctx.reason == Reason.OWNER_DIED
        assert ctx.error_message == (  # Ray's words
            f"The actor is dead because its owner has died. Owner Id: {'02' * 28} "
            "Owner Ip address: 127.0.0.2 Owner worker exit type: SYSTEM_ERROR "
            "Worker exit detail: Owner's node has crashed."
        )
        # detached: its owner's death does not kill it; its node's death restarts it
        await h.until(lambda: h.actors.get(detached_owned_on_two.actor_id).state == states.ALIVE)
        assert h.actors.get(detached_owned_on_two.actor_id).node_id == node_id(1)
        died = "The actor died because its node has died."
        assert any(
            died in a.death_cause.actor_died_error_context.error_message
            for a in h.published
            if a.actor_id == on_two.actor_id and a.state == states.RESTARTING
        )

    async def test_preemption_does_not_use_up_restarts(self) -> None:
        h = await Harness().start(1, 2)
        strategy = soft_affinity(2)
        actor = await h.create(actor_spec(1, max_restarts=0, strategy=strategy))
        await h.nodes.mark_dead(node_id(2), NodeReason.AUTOSCALER_DRAIN_PREEMPTED, "spot")
        await h.until(
            lambda: (
                h.actors.get(actor.actor_id).state == states.ALIVE
                and h.actors.get(actor.actor_id).node_id == node_id(1)
            )
        )
        after = h.actors.get(actor.actor_id)
        assert after.num_restarts == 1 and after.num_restarts_due_to_node_preemption == 1
        assert after.preempted


class TestDeaths:
    async def test_kill_no_restart_is_dead_at_once_and_kills_the_worker(self) -> None:
        h = await Harness().start(1)
        actor = await h.create(actor_spec(1, max_restarts=5, name="x"))
        await h.actors.kill(actor.actor_id, force_kill=True, no_restart=True)
        dead = h.actors.get(actor.actor_id)
        assert dead.state == states.DEAD
        ctx = dead.death_cause.actor_died_error_context
        assert ctx.reason == Reason.RAY_KILL
        assert ctx.error_message == "The actor is dead because it was killed by `ray.kill`."
        await h.actors.settle()
        ((node, kill),) = h.gateway.kills
        assert node == node_id(1) and kill.worker_id == actor.address.worker_id
        assert kill.intended_actor_id == actor.actor_id and kill.force_kill
        assert h.actors.spec_of(actor.actor_id) is None
        assert await h.store.get(TABLE_ACTOR_TASK_SPEC, actor.actor_id) is None

    async def test_kill_with_restart_kills_the_worker_and_its_death_restarts(self) -> None:
        h = await Harness().start(1)
        actor = await h.create(actor_spec(1, max_restarts=1))
        await h.actors.kill(actor.actor_id, force_kill=True, no_restart=False)
        await h.actors.settle()
        assert len(h.gateway.kills) == 1
        assert h.actors.get(actor.actor_id).state == states.ALIVE  # until the worker dies
        h.worker_failure(actor.address)
        await h.until(
            lambda: (
                h.actors.get(actor.actor_id).num_restarts == 1
                and h.actors.get(actor.actor_id).state == states.ALIVE
            )
        )

    async def test_kill_unknown_actor_is_not_found(self) -> None:
        h = await Harness().start(1)
        with pytest.raises(NotFound, match="Could not find actor with ID"):
            await h.actors.kill(b"\x09" * 16, force_kill=True, no_restart=True)

    async def test_job_finish_kills_its_non_detached_actors(self) -> None:
        h = await Harness().start(1)
        await h.jobs.add(gcs_pb2.JobTableData(job_id=JOB))
        scoped = await h.create(actor_spec(1))
        detached = await h.create(actor_spec(2, detached=True, name="d"))
        await h.jobs.mark_finished(JOB)
        await h.actors.settle()
        assert h.actors.get(scoped.actor_id).state == states.DEAD
        assert h.actors.get(detached.actor_id).state == states.ALIVE
        assert h.actors.get_named("d", "ns").actor_id == detached.actor_id
        # `ray list actors` (show_dead_jobs unset) still lists the live detached actor, and
        # the dead one as Ray's in-memory answer does
        out, _, filtered = h.actors.list_all()
        by_id = {x.actor_id: x.state for x in out}
        assert by_id == {scoped.actor_id: states.DEAD, detached.actor_id: states.ALIVE}
        assert filtered == 0

    async def test_owner_death_kills_owned_non_detached_actors(self) -> None:
        h = await Harness().start(1)
        owned = await h.create(actor_spec(1))
        detached = await h.create(actor_spec(2, detached=True))
        h.worker_failure(common_pb2.Address(node_id=node_id(1), worker_id=DRIVER))
        await h.until(lambda: h.actors.get(owned.actor_id).state == states.DEAD)
        ctx = h.actors.get(owned.actor_id).death_cause.actor_died_error_context
        assert ctx.reason == Reason.OWNER_DIED
        assert ctx.error_message.startswith("The actor is dead because its owner has died.")
        assert h.actors.get(detached.actor_id).state == states.ALIVE

    async def test_an_owner_drivers_exit_reads_as_on_ray_not_as_its_own_exit_detail(
        self,
    ) -> None:
        """Ray's GCS names the owner's exit type and says "Owner's worker process has
        crashed." whatever the driver's own detail (the dashboard's Actors page showed
        "Shutdown by ray.shutdown()." on ours)."""
        h = await Harness().start(1)
        owned = await h.create(actor_spec(1))
        driver = common_pb2.Address(node_id=node_id(1), worker_id=DRIVER, ip_address="127.0.0.9")
        h.worker_failure(driver, common_pb2.INTENDED_USER_EXIT, "Shutdown by ray.shutdown().")
        await h.until(lambda: h.actors.get(owned.actor_id).state == states.DEAD)
        ctx = h.actors.get(owned.actor_id).death_cause.actor_died_error_context
        assert ctx.error_message == (
            f"The actor is dead because its owner has died. Owner Id: {DRIVER.hex()} "
            "Owner Ip address: 127.0.0.9 Owner worker exit type: INTENDED_USER_EXIT "
            "Worker exit detail: Owner's worker process has crashed."
        )

    async def test_death_before_creation_answers_the_waiting_create(self) -> None:
        """Killed while its lease waits at a raylet: CreateActor is answered, and the
        queued lease is withdrawn (CancelWorkerLease)."""
        h = await Harness().start(1)
        h.gateway.lease_gate[node_id(1)] = asyncio.Event()  # the raylet keeps it queued
        spec = actor_spec(1, cpus=64)
        await h.actors.register(spec)
        creating = asyncio.ensure_future(h.actors.create(spec))
        await h.gateway.changes.until(lambda: len(h.gateway.leases) == 1)
        actor_id = spec.actor_creation_task_spec.actor_id
        await h.actors.kill(actor_id, force_kill=True, no_restart=True)
        reply = await asyncio.wait_for(creating, 10)
        assert reply.status.code == 19
        assert reply.death_cause.actor_died_error_context.never_started
        await h.actors.settle()
        lease_id = h.gateway.leases[0].request.lease_spec.lease_id
        assert h.gateway.cancelled == [(node_id(1), lease_id)]


class TestJobRelease:
    """A job is released (what it exported to internal KV can go: Ray's
    ``GCSFunctionManager``) once it has finished and no detached actor it created is alive;
    once, not per actor death."""

    async def test_a_job_without_detached_actors_is_released_when_it_finishes(self) -> None:
        h = await Harness().start(1)
        await h.jobs.add(gcs_pb2.JobTableData(job_id=JOB))
        await h.create(actor_spec(1))
        await h.create(actor_spec(2))
        await h.actors.settle()
        assert h.released_jobs == []
        await h.jobs.mark_finished(JOB)
        await h.actors.settle()
        assert h.released_jobs == [JOB]  # the job's two actors dying did not add to it

    async def test_the_last_detached_actors_death_releases_a_finished_job(self) -> None:
        h = await Harness().start(1)
        await h.jobs.add(gcs_pb2.JobTableData(job_id=JOB))
        first = await h.create(actor_spec(1, detached=True))
        second = await h.create(actor_spec(2, detached=True))
        await h.jobs.mark_finished(JOB)
        await h.actors.settle()
        assert h.released_jobs == []
        await h.actors.kill(first.actor_id, force_kill=True, no_restart=True)
        await h.actors.settle()
        assert h.released_jobs == []
        await h.actors.kill(second.actor_id, force_kill=True, no_restart=True)
        await h.actors.settle()
        assert h.released_jobs == [JOB]

    async def test_a_detached_actors_death_while_the_job_runs_releases_nothing(self) -> None:
        h = await Harness().start(1)
        await h.jobs.add(gcs_pb2.JobTableData(job_id=JOB))
        detached = await h.create(actor_spec(1, detached=True))
        await h.actors.kill(detached.actor_id, force_kill=True, no_restart=True)
        await h.actors.settle()
        assert h.released_jobs == []
        await h.jobs.mark_finished(JOB)
        await h.actors.settle()
        assert h.released_jobs == [JOB]

    async def test_a_restarting_detached_actor_holds_the_job(self) -> None:
        h = await Harness().start(1)
        await h.jobs.add(gcs_pb2.JobTableData(job_id=JOB))
        detached = await h.create(actor_spec(1, detached=True, max_restarts=1))
        await h.jobs.mark_finished(JOB)
        h.worker_failure(detached.address)
        await h.until(lambda: h.actors.get(detached.actor_id).num_restarts == 1)
        await h.actors.settle()
        assert h.released_jobs == []

    async def test_after_a_gcs_restart_the_reloaded_detached_actor_still_holds_the_job(
        self,
    ) -> None:
        h = await Harness().start(1)
        await h.jobs.add(gcs_pb2.JobTableData(job_id=JOB))
        detached = await h.create(actor_spec(1, detached=True))
        await h.jobs.mark_finished(JOB)
        await h.actors.close()

        again = await h.restarted().start()
        assert again.released_jobs == []
        await again.actors.kill(detached.actor_id, force_kill=True, no_restart=True)
        await again.actors.settle()
        assert again.released_jobs == [JOB]
        await again.actors.close()


class TestLineage:
    async def test_out_of_scope_then_restart_for_lineage_reconstruction(self) -> None:
        h = await Harness().start(1)
        actor = await h.create(actor_spec(1))
        await h.actors.report_out_of_scope(actor.actor_id, 0)
        dead = h.actors.get(actor.actor_id)
        assert dead.state == states.DEAD
        assert dead.death_cause.actor_died_error_context.reason == Reason.OUT_OF_SCOPE
        assert h.actors.spec_of(actor.actor_id) is not None  # restartable: the spec is kept
        await h.actors.restart_for_lineage(actor.actor_id, 1)
        await h.until(lambda: h.actors.get(actor.actor_id).state == states.ALIVE)
        assert h.actors.get(actor.actor_id).num_restarts_due_to_lineage_reconstruction == 1
        await h.actors.restart_for_lineage(actor.actor_id, 1)  # stale: ignored
        with pytest.raises(FailedPrecondition, match="is not an out-of-scope dead actor"):
            await h.actors.restart_for_lineage(actor.actor_id, 2)  # alive
        await h.actors.report_out_of_scope(actor.actor_id, 0)  # stale: ignored
        assert h.actors.get(actor.actor_id).state == states.ALIVE


class TestPersistence:
    async def test_detached_actor_survives_a_gcs_restart(self) -> None:
        h = await Harness().start(1)
        detached = await h.create(actor_spec(1, detached=True, name="keeper"))
        gate = h.gateway.lease_gate[node_id(1)] = asyncio.Event()  # creation in flight
        pending = actor_spec(2, cpus=64)
        await h.actors.register(pending)
        creating = asyncio.ensure_future(h.actors.create(pending))
        pending_id = pending.actor_creation_task_spec.actor_id
        await h.gateway.changes.until(lambda: len(h.gateway.leases) == 2)
        await h.actors.close()
        creating.cancel()
        del h.gateway.lease_gate[node_id(1)]
        gate.set()

        again = await h.restarted().start()
        back = again.actors.get_named("keeper", "ns")
        assert back == detached and back.state == states.ALIVE
        assert again.actors.spec_of(detached.actor_id) == actor_spec(
            1, detached=True, name="keeper"
        )
        # the creation that was in flight is scheduled again
        await again.until(lambda: again.actors.get(pending_id).state == states.ALIVE)
        assert len(h.gateway.leases) == 3
        await again.actors.close()

    async def test_release_unused_workers_names_the_live_actors_workers(self) -> None:
        h = await Harness().start(1, 2)
        alive = await h.create(actor_spec(1, owner_node=1, strategy=soft_affinity(1)))
        await h.create(actor_spec(2, owner_node=2, strategy=soft_affinity(2)))
        await h.actors.release_unused_workers(h.nodes.alive[node_id(1)])
        assert h.gateway.released == [(node_id(1), [alive.address.worker_id])]

    async def test_actors_of_a_dead_owner_node_are_dead_after_restart(self) -> None:
        h = await Harness().start(1, 2)
        scoped = await h.create(actor_spec(1, owner_node=2))
        await h.actors.close()
        again = h.restarted()
        await again.nodes.load()
        await again.nodes.mark_dead(node_id(2), NodeReason.UNEXPECTED_TERMINATION, "gone")
        await again.actors.load()
        dead = again.actors.get(scoped.actor_id)
        assert dead.state == states.DEAD
        assert "could not load it during initialization" in (
            dead.death_cause.actor_died_error_context.error_message
        )
        assert await again.store.get(TABLE_ACTOR_TASK_SPEC, scoped.actor_id) is None

    async def test_actors_of_a_job_finished_before_a_kill_9_are_dead_after_restart(self) -> None:
        """The job's death was persisted, its actors' deaths not (kill -9 in between): on
        restart the job-owned actor is dead (Ray's OnInitializeActorShouldLoad), its worker
        is no longer in use; a detached actor of that job lives on."""
        h = await Harness().start(1)
        await h.jobs.add(gcs_pb2.JobTableData(job_id=JOB))
        scoped = await h.create(actor_spec(1))
        detached = await h.create(actor_spec(2, detached=True, name="keeper"))
        await h.actors.close()
        finished = gcs_pb2.JobTableData(job_id=JOB, is_dead=True)
        await h.store.write(WriteBatch().put(TABLE_JOB, JOB, finished.SerializeToString()))

        again = await h.restarted().start()
        dead = again.actors.get(scoped.actor_id)
        assert dead.state == states.DEAD
        assert dead.death_cause.actor_died_error_context.reason == Reason.OWNER_DIED
        assert again.actors.get(detached.actor_id).state == states.ALIVE
        await again.actors.release_unused_workers(again.nodes.alive[node_id(1)])
        assert again.gateway.released[-1] == (node_id(1), [detached.address.worker_id])

    async def test_actors_under_a_dead_root_detached_actor_are_dead_after_restart(
        self,
    ) -> None:
        """An actor created by a detached actor dies with that root actor; the root's death
        was persisted before a kill -9, the child's not."""
        h = await Harness().start(1)
        root = await h.create(actor_spec(1, detached=True, name="root", owner=b"\xd1" * 28))
        child_spec = actor_spec(2, owner=root.address.worker_id)
        child_spec.root_detached_actor_id = root.actor_id
        child = await h.create(child_spec)
        other_spec = actor_spec(3, owner=root.address.worker_id)
        other_spec.root_detached_actor_id = b"\xff" * 16  # nil: owned by its (live) job
        other = await h.create(other_spec)
        await h.actors.close()
        dead_root = Actor()
        dead_root.CopyFrom(root)
        dead_root.state = states.DEAD
        batch = WriteBatch().put(TABLE_ACTOR, root.actor_id, dead_root.SerializeToString())
        await h.store.write(batch)

        again = await h.restarted().start()
        assert again.actors.get(child.actor_id).state == states.DEAD
        assert again.actors.get(other.actor_id).state == states.ALIVE


class TestDeadCache:
    async def test_oldest_dead_actors_are_evicted_from_memory_and_store(self) -> None:
        h = await Harness(max_dead_cached=2).start(1)
        ids = [(await h.create(actor_spec(n))).actor_id for n in (1, 2, 3)]
        for actor_id in ids:
            await h.actors.kill(actor_id, force_kill=True, no_restart=True)
        assert ids[0] not in h.actors.view and all(i in h.actors.view for i in ids[1:])
        assert await h.store.get(TABLE_ACTOR, ids[0]) is None
        assert await h.store.get(TABLE_ACTOR, ids[2]) is not None


class TestQueries:
    async def test_get_all_filters_and_limit(self) -> None:
        h = await Harness().start(1)
        a = await h.create(actor_spec(1))
        b = await h.create(actor_spec(2, job=(2).to_bytes(4, "little")))
        await h.actors.kill(b.actor_id, force_kill=True, no_restart=True)
        out, total, filtered = h.actors.list_all(state=states.ALIVE)
        assert [x.actor_id for x in out] == [a.actor_id] and total == 2 and filtered == 1
        out, _, filtered = h.actors.list_all(job_id=(2).to_bytes(4, "little"))
        assert [x.actor_id for x in out] == [b.actor_id] and filtered == 1
        out, _, _ = h.actors.list_all(limit=1)
        assert len(out) == 1
        out, _, _ = h.actors.list_all(actor_id=b.actor_id)
        assert [x.actor_id for x in out] == [b.actor_id]
