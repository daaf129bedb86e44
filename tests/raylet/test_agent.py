"""The raylet agent against a fake GCS: registration, load, leases, drain, resize, health."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gcs.base.clock import FakeClock
from gcs.proto import autoscaler_pb2, common_pb2, node_manager_pb2
from gcs.raylet.agent import ExitReason
from gcs.raylet.servicer import IDLE_DRAIN_REJECTED
from tests.raylet.conftest import FAST

TICK = FAST["liveness_check_interval_ms"] / 1000
"""Step of the agent's clock: each step may start one liveness check."""
IDLE = autoscaler_pb2.DRAIN_NODE_REASON_IDLE_TERMINATION
PREEMPT = autoscaler_pb2.DRAIN_NODE_REASON_PREEMPTION


def lease_request(lease_id: bytes, selector=None, **shape: float):
    spec = common_pb2.LeaseSpec(lease_id=lease_id, required_resources=shape)
    if selector is not None:
        spec.label_selector.CopyFrom(selector)
    return node_manager_pb2.RequestWorkerLeaseRequest(lease_spec=spec)


async def load(stub):
    reply = await stub.GetResourceLoad(node_manager_pb2.GetResourceLoadRequest())
    return reply.resources


class TestRegistration:
    """On start the agent asks for the cluster id, then registers a full GcsNodeInfo."""

    async def test_register_node_carries_the_full_node_info(self, fake_gcs, make_agent) -> None:
        """Every field a GCS needs is filled, and ray.io/node-id is among the labels."""
        agent = await make_agent(
            resources={"CPU": 4.0, "memory": 1e9},
            node_type="cpu-worker",
            labels={"zone": "a"},
            node_name="n1",
            instance_id="i-1",
            is_head=True,
            node_id=b"\x07" * 28,
        )
        [info] = fake_gcs.servicer.registered
        assert info.node_id == b"\x07" * 28
        assert info.node_manager_address == "127.0.0.1"
        assert info.node_manager_port == agent.port > 0
        assert info.object_manager_port > 0
        assert info.node_manager_hostname
        assert dict(info.resources_total) == {"CPU": 4.0, "memory": 1e9}
        assert (info.node_name, info.instance_id, info.node_type_name) == (
            "n1",
            "i-1",
            "cpu-worker",
        )
        assert info.is_head_node
        assert info.start_time_ms > 0
        assert info.state == info.ALIVE
        assert dict(info.labels) == {"zone": "a", "ray.io/node-id": "07" * 28}

    async def test_register_node_sends_the_cluster_id_metadata(self, fake_gcs, make_agent) -> None:
        """Calls after GetClusterId carry ray_cluster_id = hex."""
        await make_agent()
        [md] = fake_gcs.servicer.register_metadata
        assert md["ray_cluster_id"] == fake_gcs.servicer.cluster_id.hex()

    async def test_liveness_self_check_sends_own_node_id(
        self, fake_gcs, make_agent, clock: FakeClock
    ) -> None:
        """CheckAlive runs on the configured interval (of the agent's clock) with its id."""
        agent = await make_agent()
        assert fake_gcs.servicer.check_alive_calls == []  # not before the interval
        await clock.advance_until(lambda: len(fake_gcs.servicer.check_alive_calls) >= 2, TICK)
        assert fake_gcs.servicer.check_alive_calls[0] == [agent.node_id]

    async def test_agent_exits_when_the_gcs_says_it_is_dead(
        self, fake_gcs, make_agent, clock: FakeClock
    ) -> None:
        """Ray semantics: raylet_alive=false makes the raylet exit."""
        agent = await make_agent()
        fake_gcs.servicer.dead.add(agent.node_id)
        await clock.advance_until(lambda: agent.exit_reason is not None, TICK)
        assert await agent.wait() is ExitReason.DECLARED_DEAD

    async def test_agent_reregisters_when_dead_if_configured(
        self, fake_gcs, make_agent, clock: FakeClock
    ) -> None:
        """reregister_when_dead turns a dead verdict into a new RegisterNode."""
        agent = await make_agent(reregister_when_dead=True)
        fake_gcs.servicer.dead.add(agent.node_id)
        await clock.advance_until(lambda: agent.registrations >= 2, TICK)
        assert agent.exit_reason is None


class TestGcsRestart:
    """Same cluster id → re-register; different cluster id → fate-share."""

    async def test_agent_reregisters_after_the_gcs_comes_back(
        self, fake_gcs, make_agent, clock: FakeClock
    ) -> None:
        """The agent notices the GCS is gone (its next liveness check), retries on its
        back-off, and registers again."""
        agent = await make_agent()
        await fake_gcs.stop()
        await clock.advance_until(lambda: not agent.gcs_connected, TICK)
        await fake_gcs.start()
        await clock.advance_until(lambda: agent.registrations == 2, TICK)
        assert len(fake_gcs.servicer.registered) == 2
        assert fake_gcs.servicer.registered[1].node_id == agent.node_id

    async def test_agent_exits_when_the_cluster_id_changes(
        self, fake_gcs, make_agent, clock: FakeClock
    ) -> None:
        """A new non-persistent GCS has a new cluster id: the raylet fate-shares."""
        agent = await make_agent()
        await fake_gcs.stop()
        await clock.advance_until(lambda: not agent.gcs_connected, TICK)
        await fake_gcs.restart(new_cluster=True)
        await clock.advance_until(lambda: agent.exit_reason is not None, TICK)
        assert await agent.wait() is ExitReason.CLUSTER_CHANGED
        assert fake_gcs.servicer.registered == []

    async def test_agent_joins_the_new_cluster_when_told_to(
        self, fake_gcs, make_agent, clock: FakeClock
    ) -> None:
        """rejoin_new_cluster registers with the new cluster id instead of exiting."""
        agent = await make_agent(rejoin_new_cluster=True)
        await fake_gcs.stop()
        await clock.advance_until(lambda: not agent.gcs_connected, TICK)
        await fake_gcs.restart(new_cluster=True)
        await clock.advance_until(lambda: len(fake_gcs.servicer.registered) == 1, TICK)
        assert agent.cluster_id == fake_gcs.servicer.cluster_id

    async def test_notify_gcs_restart_triggers_reregistration(
        self, fake_gcs, make_agent, node_manager
    ) -> None:
        """NotifyGCSRestart makes the agent check the cluster id and register again."""
        agent = await make_agent(liveness_check_interval_ms=60_000)
        await node_manager(agent).NotifyGCSRestart(node_manager_pb2.NotifyGCSRestartRequest())
        await agent.changes.until(lambda: agent.registrations == 2)  # no time passes


class TestGcsGone:
    """Ray's ``gcs_rpc_server_reconnect_timeout_s``: an agent whose GCS stays gone exits."""

    async def test_agent_exits_once_the_gcs_was_unreachable_for_the_timeout(
        self, fake_gcs, make_agent, clock: FakeClock
    ) -> None:
        """Still retrying just before the 60 s (Ray's default) of the outage; exited
        GCS_UNREACHABLE right after, with a sentence saying why."""
        agent = await make_agent()
        assert agent.config.gcs_rpc_server_reconnect_timeout_s == 60.0
        await fake_gcs.stop()
        await clock.advance_until(lambda: not agent.gcs_connected, TICK)
        outage_seen = clock.monotonic_s()  # the outage began at most one TICK earlier
        await clock.run_for(60 - 2 * TICK, step_s=0.5)
        assert agent.exit_reason is None
        await clock.advance_until(lambda: agent.exit_reason is not None, 0.01)
        assert await agent.wait() is ExitReason.GCS_UNREACHABLE
        assert clock.monotonic_s() - outage_seen < 61
        assert "unreachable for 60 s" in agent.exit_message
        assert fake_gcs.address in agent.exit_message

    async def test_a_gcs_back_in_time_resets_the_outage_clock(
        self, fake_gcs, make_agent, clock: FakeClock
    ) -> None:
        """Back before the timeout: re-registered; a later outage gets a full timeout."""
        agent = await make_agent(gcs_rpc_server_reconnect_timeout_s=30)
        await fake_gcs.stop()
        await clock.advance_until(lambda: not agent.gcs_connected, TICK)
        await clock.run_for(20, step_s=0.5)
        await fake_gcs.start()
        # gRPC's own reconnect back-off runs on wall time: let time pass slowly enough
        # for the channel to come back (10 s of the agent's time = 20 s of wall time here)
        for _ in range(1000):
            if agent.registrations == 2 or agent.exit_reason is not None:
                break
            clock.advance(0.01)
            await asyncio.sleep(0.02)
        assert agent.registrations == 2 and agent.exit_reason is None
        await fake_gcs.stop()
        await clock.advance_until(lambda: not agent.gcs_connected, TICK)
        await clock.run_for(30 - 2 * TICK, step_s=0.5)
        assert agent.exit_reason is None
        await clock.advance_until(lambda: agent.exit_reason is not None, 0.05)
        assert agent.exit_reason is ExitReason.GCS_UNREACHABLE

    async def test_a_broken_syncer_stream_starts_the_outage_clock_at_once(
        self, fake_gcs, make_agent, clock: FakeClock
    ) -> None:
        """With a 60 s liveness interval, the syncer stream breaking with the GCS makes the
        agent check at once: it exits about the timeout after the GCS went, not a liveness
        interval later."""
        agent = await make_agent(liveness_check_interval_ms=60_000,
                                 gcs_rpc_server_reconnect_timeout_s=5)  # fmt: skip
        gone = clock.monotonic_s()
        await fake_gcs.stop()
        await clock.advance_until(lambda: agent.exit_reason is not None, 0.05)
        assert agent.exit_reason is ExitReason.GCS_UNREACHABLE
        assert clock.monotonic_s() - gone < 10


class TestResourceLoad:
    """GetResourceLoad returns a full ResourcesData."""

    async def test_idle_node_reports_totals_labels_and_no_drain(self, make_agent, node_manager):
        """An idle node: available == total, empty load, deadline -1."""
        agent = await make_agent(resources={"CPU": 2.0}, labels={"zone": "a"})
        data = await load(node_manager(agent))
        assert data.node_id == agent.node_id
        assert dict(data.resources_total) == dict(data.resources_available) == {"CPU": 2.0}
        assert not data.resource_load and not data.resource_load_by_shape.resource_demands
        assert data.node_manager_address == "127.0.0.1"
        assert not data.is_draining
        assert data.draining_deadline_timestamp_ms == -1
        assert data.labels["zone"] == "a"
        assert data.labels["ray.io/node-id"] == agent.node_id.hex()

    async def test_idle_duration_grows_with_the_clock_and_resets_when_work_lands(
        self, make_agent, node_manager, clock: FakeClock
    ) -> None:
        """ms since idle; 0 while a lease is held; counts again from the return."""
        agent = await make_agent()
        stub = node_manager(agent)
        clock.advance(5)
        assert (await load(stub)).idle_duration_ms == 5000
        await stub.RequestWorkerLease(lease_request(b"a", CPU=1))
        clock.advance(3)
        assert (await load(stub)).idle_duration_ms == 0
        await stub.ReturnWorkerLease(node_manager_pb2.ReturnWorkerLeaseRequest(lease_id=b"a"))
        clock.advance(2)
        assert (await load(stub)).idle_duration_ms == 2000

    async def test_queued_and_infeasible_demand_is_reported_by_shape(
        self, make_agent, node_manager
    ) -> None:
        """One row per shape with ready/infeasible counts and ONE empty LabelSelector."""
        agent = await make_agent(resources={"CPU": 2.0})
        stub = node_manager(agent)
        await stub.RequestWorkerLease(lease_request(b"a", CPU=2))
        waiting = [
            asyncio.ensure_future(stub.RequestWorkerLease(lease_request(b"b", CPU=1))),
            asyncio.ensure_future(stub.RequestWorkerLease(lease_request(b"c", CPU=4))),
        ]
        await agent.resources.changes.until(lambda: len(agent.resources.load()[1]) == 2)
        data = await load(stub)
        assert dict(data.resource_load) == {"CPU": 5.0}
        rows = data.resource_load_by_shape.resource_demands
        assert [(dict(r.shape), r.num_ready_requests_queued, r.num_infeasible_requests_queued)
                for r in rows] == [({"CPU": 1.0}, 1, 0), ({"CPU": 4.0}, 0, 1)]  # fmt: skip
        assert all(len(r.label_selectors) == 1 for r in rows)
        assert not rows[0].label_selectors[0].label_constraints
        assert dict(data.resources_available) == {"CPU": 0.0}
        for fut in waiting:
            fut.cancel()

    async def test_a_label_selector_is_reported_with_its_constraints(
        self, make_agent, node_manager
    ) -> None:
        """The request's label_selector becomes the row's selector."""
        agent = await make_agent(labels={"zone": "a"})
        stub = node_manager(agent)
        selector = common_pb2.LabelSelector(
            label_constraints=[
                common_pb2.LabelSelectorConstraint(
                    label_key="zone", operator=common_pb2.LABEL_OPERATOR_IN, label_values=["b"]
                )
            ]
        )
        fut = asyncio.ensure_future(stub.RequestWorkerLease(lease_request(b"a", selector, CPU=1)))
        await agent.resources.changes.until(lambda: agent.resources.load()[1])
        [row] = (await load(stub)).resource_load_by_shape.resource_demands
        assert row.num_infeasible_requests_queued == 1
        assert list(row.label_selectors) == [selector]
        fut.cancel()


class TestLeases:
    """RequestWorkerLease / ReturnWorkerLease / CancelWorkerLease with real accounting."""

    async def test_a_fitting_lease_is_granted_with_a_worker_address(self, make_agent, node_manager):
        """The reply names a synthetic worker on this node and maps the resources."""
        agent = await make_agent()
        reply = await node_manager(agent).RequestWorkerLease(lease_request(b"a", CPU=1))
        assert reply.worker_address.node_id == agent.node_id
        assert reply.worker_address.ip_address == "127.0.0.1"
        assert len(reply.worker_address.worker_id) == 28
        assert [(e.name, e.resource_ids[0].quantity) for e in reply.resource_mapping] == [
            ("CPU", 1.0)
        ]
        assert not reply.rejected and not reply.canceled

    async def test_returning_a_lease_grants_queued_leases_in_fifo_order(
        self, make_agent, node_manager
    ) -> None:
        """Waiting RPCs are answered as resources free up, oldest first."""
        agent = await make_agent(resources={"CPU": 2.0})
        stub = node_manager(agent)
        await stub.RequestWorkerLease(lease_request(b"a", CPU=2))
        b = asyncio.ensure_future(stub.RequestWorkerLease(lease_request(b"b", CPU=2)))
        await agent.resources.changes.until(lambda: agent.resources.load()[1])
        c = asyncio.ensure_future(stub.RequestWorkerLease(lease_request(b"c", CPU=1)))
        await agent.resources.changes.until(
            lambda: sum(r.ready for r in agent.resources.load()[1]) == 2
        )
        assert not b.done() and not c.done()
        await stub.ReturnWorkerLease(node_manager_pb2.ReturnWorkerLeaseRequest(lease_id=b"a"))
        assert (await b).HasField("worker_address")
        assert not c.done()
        reply_b = b.result()
        await stub.ReturnWorkerLease(
            node_manager_pb2.ReturnWorkerLeaseRequest(worker_port=reply_b.worker_address.port)
        )
        assert (await c).HasField("worker_address")

    async def test_kill_local_actor_frees_the_workers_lease(self, make_agent, node_manager):
        """KillLocalActor (the GCS killing an actor) ends its worker: the lease's resources
        go back and a queued lease is granted, as on a raylet."""
        agent = await make_agent(resources={"CPU": 1.0})
        stub = node_manager(agent)
        first = await stub.RequestWorkerLease(lease_request(b"a", CPU=1))
        queued = asyncio.ensure_future(stub.RequestWorkerLease(lease_request(b"b", CPU=1)))
        await agent.resources.changes.until(lambda: agent.resources.load()[1])
        await stub.KillLocalActor(
            node_manager_pb2.KillLocalActorRequest(
                worker_id=first.worker_address.worker_id, force_kill=True
            )
        )
        assert (await queued).HasField("worker_address")

    async def test_a_worker_port_names_one_core_worker_for_every_lease(
        self, make_agent, node_manager
    ) -> None:
        """With ``worker_port`` every grant names that port (one fake core worker serving
        every leased worker), each with its own worker id."""
        agent = await make_agent(resources={"CPU": 2.0}, worker_port=23456)
        stub = node_manager(agent)
        a = await stub.RequestWorkerLease(lease_request(b"a", CPU=1))
        b = await stub.RequestWorkerLease(lease_request(b"b", CPU=1))
        assert a.worker_address.port == b.worker_address.port == 23456
        assert a.worker_address.worker_id != b.worker_address.worker_id

    async def test_cancelling_an_infeasible_lease_replies_canceled(self, make_agent, node_manager):
        """The waiting request ends with canceled and stops counting as demand."""
        agent = await make_agent()
        stub = node_manager(agent)
        fut = asyncio.ensure_future(stub.RequestWorkerLease(lease_request(b"x", GPU=1)))
        await agent.resources.changes.until(lambda: agent.resources.load()[1])
        await stub.CancelWorkerLease(node_manager_pb2.CancelWorkerLeaseRequest(lease_id=b"x"))
        reply = await fut
        assert reply.canceled
        assert reply.failure_type == reply.SCHEDULING_CANCELLED_INTENDED
        assert not (await load(stub)).resource_load_by_shape.resource_demands

    async def test_grant_or_reject_rejects_instead_of_queueing(self, make_agent, node_manager):
        """grant_or_reject: no waiting; the reply is rejected."""
        agent = await make_agent(resources={"CPU": 1.0})
        stub = node_manager(agent)
        request = lease_request(b"a", CPU=2)
        request.grant_or_reject = True
        assert (await stub.RequestWorkerLease(request)).rejected
        assert not agent.resources.load()[1]

    async def test_a_requester_that_goes_away_leaves_no_demand(self, make_agent, node_manager):
        """A cancelled RPC withdraws its queued request."""
        agent = await make_agent(resources={"CPU": 1.0})
        fut = asyncio.ensure_future(
            node_manager(agent).RequestWorkerLease(lease_request(b"a", CPU=2))
        )
        await agent.resources.changes.until(lambda: agent.resources.load()[1])
        fut.cancel()
        await agent.resources.changes.until(lambda: not agent.resources.load()[1])

    async def test_synthetic_hold_frees_the_lease_by_itself(
        self, make_agent, node_manager, clock: FakeClock
    ):
        """Metadata gcs-synthetic-seconds: the raylet returns the lease after that long (on
        the agent's clock: held however slow the machine, freed once the time has passed)."""
        agent = await make_agent()
        reply = await node_manager(agent).RequestWorkerLease(
            lease_request(b"a", CPU=1), metadata=[("gcs-synthetic-seconds", "5")]
        )
        assert reply.HasField("worker_address")
        await clock.run_for(4.9, step_s=TICK)  # the agent's loops run; the hold is not due
        assert agent.resources.busy
        clock.advance(0.2)  # past the 5 s (steps of 0.05 s add up to a hair under 4.9)
        await agent.resources.changes.until(lambda: not agent.resources.busy)

    async def test_detached_requests_reply_at_once_and_stay_queued(
        self, make_agent, node_manager, clock: FakeClock
    ):
        """gcs-synthetic-detach: an empty reply; the raylet grants and frees it later."""
        agent = await make_agent(resources={"CPU": 1.0})
        stub = node_manager(agent)
        md = [("gcs-synthetic-seconds", "0.05"), ("gcs-synthetic-detach", "1")]
        first = await stub.RequestWorkerLease(lease_request(b"a", CPU=1), metadata=md)
        second = await stub.RequestWorkerLease(lease_request(b"b", CPU=1), metadata=md)
        assert first.HasField("worker_address")
        assert not second.HasField("worker_address") and not second.rejected
        assert agent.resources.state_of(b"b") is not None
        await clock.advance_until(
            lambda: agent.resources.state_of(b"b") is None and not agent.resources.busy, TICK
        )


class TestDrain:
    """DrainRaylet: idle drains need an idle node; preemption is always accepted."""

    async def test_idle_drain_of_an_idle_node_unregisters_and_exits(
        self, fake_gcs, make_agent, node_manager
    ) -> None:
        """Accepted; UnregisterNode with AUTOSCALER_DRAIN_IDLE and the drain message."""
        agent = await make_agent()
        reply = await node_manager(agent).DrainRaylet(
            node_manager_pb2.DrainRayletRequest(reason=IDLE, reason_message="idle 60s")
        )
        assert reply.is_accepted
        assert await asyncio.wait_for(agent.wait(), 30) is ExitReason.DRAINED_IDLE
        [unreg] = fake_gcs.servicer.unregistered
        assert unreg.node_id == agent.node_id
        assert unreg.node_death_info.reason == common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_IDLE
        assert unreg.node_death_info.reason_message == "idle 60s"

    async def test_idle_drain_of_a_busy_node_is_rejected(self, fake_gcs, make_agent, node_manager):
        """A node holding a lease is not idle: rejected with a message; it keeps running."""
        agent = await make_agent()
        stub = node_manager(agent)
        await stub.RequestWorkerLease(lease_request(b"a", CPU=1))
        reply = await stub.DrainRaylet(node_manager_pb2.DrainRayletRequest(reason=IDLE))
        assert not reply.is_accepted
        assert reply.rejection_reason_message == IDLE_DRAIN_REJECTED
        assert not (await load(stub)).is_draining
        assert agent.exit_reason is None and not fake_gcs.servicer.unregistered

    async def test_preemption_drain_is_accepted_while_busy_and_reported(
        self, make_agent, node_manager
    ) -> None:
        """The node reports is_draining with the deadline and refuses new leases."""
        agent = await make_agent()
        stub = node_manager(agent)
        await stub.RequestWorkerLease(lease_request(b"a", CPU=1))
        reply = await stub.DrainRaylet(
            node_manager_pb2.DrainRayletRequest(reason=PREEMPT, deadline_timestamp_ms=123)
        )
        assert reply.is_accepted
        data = await load(stub)
        assert data.is_draining and data.draining_deadline_timestamp_ms == 123
        assert (await stub.RequestWorkerLease(lease_request(b"b", CPU=1))).rejected
        assert agent.exit_reason is None

    async def test_shutdown_raylet_unregisters_as_expected_termination(
        self, fake_gcs, make_agent, node_manager
    ) -> None:
        """ShutdownRaylet stops the agent after telling the GCS."""
        agent = await make_agent()
        await node_manager(agent).ShutdownRaylet(
            node_manager_pb2.ShutdownRayletRequest(graceful=True)
        )
        assert await asyncio.wait_for(agent.wait(), 30) is ExitReason.SHUTDOWN_REQUESTED
        [unreg] = fake_gcs.servicer.unregistered
        assert unreg.node_death_info.reason == common_pb2.NodeDeathInfo.EXPECTED_TERMINATION


class TestResize:
    """ResizeLocalResourceInstances validates and applies new totals."""

    @pytest.mark.parametrize("resources", [{"foo": 5.0}, {"GPU": 1.0}, {"CPU": 3.0, "foo": 1.0}])
    async def test_unknown_or_unit_instance_resources_are_invalid(
        self, make_agent, node_manager, resources
    ) -> None:
        """INVALID_ARGUMENT, and the totals stay as they were."""
        agent = await make_agent(resources={"CPU": 2.0, "GPU": 1.0})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await node_manager(agent).ResizeLocalResourceInstances(
                node_manager_pb2.ResizeLocalResourceInstancesRequest(resources=resources)
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert agent.resources.total == {"CPU": 2.0, "GPU": 1.0}

    async def test_resize_replies_all_totals_and_keeps_in_use(self, make_agent, node_manager):
        """New totals apply; a held lease keeps its share."""
        agent = await make_agent(resources={"CPU": 2.0, "memory": 10.0})
        stub = node_manager(agent)
        await stub.RequestWorkerLease(lease_request(b"a", CPU=2))
        reply = await stub.ResizeLocalResourceInstances(
            node_manager_pb2.ResizeLocalResourceInstancesRequest(resources={"CPU": 3.0})
        )
        assert dict(reply.total_resources) == {"CPU": 3.0, "memory": 10.0}
        assert (await load(stub)).resources_available["CPU"] == 1.0


class TestHealth:
    """grpc.health.v1: "" and the node id hex are SERVING; other names are unknown."""

    async def test_health_service_answers_for_the_node(self, make_agent) -> None:
        """The GCS health-checks with service = node id hex."""
        agent = await make_agent()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for name in ("", agent.node_id.hex()):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=30)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Check(health_pb2.HealthCheckRequest(service="other"), timeout=30)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
