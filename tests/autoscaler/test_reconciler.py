"""Reconciler: Ray 2.60's reconciler scenarios (§5.2) with Ray's outcome, on fakes."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Sequence
from typing import Any

import pytest

from gcs.autoscaler.config import ClusterConfig, parse_cluster_config
from gcs.autoscaler.instances import (
    Instance,
    InstanceManager,
    MemoryInstanceStorage,
    StatusHistory,
)
from gcs.autoscaler.providers import LaunchNodeError, TerminateNodeError
from gcs.autoscaler.reconciler import (
    CloudInstanceUpdater,
    EventLog,
    RayStopper,
    ReconcileConfig,
    Reconciler,
    steps,
)
from gcs.policy.autoscaling.model import InstanceStatus as S
from gcs.policy.autoscaling.model import NodeKind, RayNode, RayNodeStatus
from gcs.policy.autoscaling.scheduler.types import SchedulingReply, Termination, TerminationCause
from gcs.proto import autoscaler_pb2
from gcs.testing.cloud import FakeAutoscalerGcs, FakeCloudProvider
from tests.autoscaler.clock import SteppedClock

SEC = 1_000_000_000


def inst(
    iid: str,
    status: S,
    *,
    itype: str = "type-1",
    cloud: str = "",
    node: str = "",
    kind: NodeKind = NodeKind.WORKER,
    launch: str = "",
    history: Sequence[tuple[S, float]] = (),
) -> Instance:
    hist = tuple(StatusHistory(s, int(t * SEC)) for s, t in history) or (StatusHistory(status, 0),)
    return Instance(iid, status, itype, kind, cloud, node, launch, None, hist)


def rows(*instances: Instance) -> dict[str, Instance]:
    return {i.instance_id: i for i in instances}


def ids() -> itertools.count:  # type: ignore[type-arg]
    return itertools.count(100)


def new_id_fn():  # type: ignore[no-untyped-def]
    counter = ids()
    return lambda: f"new-{next(counter)}"


class TestSyncSteps:
    def test_requested_instance_no_op(self) -> None:
        assert steps.allocate(rows(inst("i-1", S.REQUESTED, launch="l1")), {}, []) == []

    def test_requested_to_allocated_by_type(self) -> None:
        from gcs.autoscaler.providers import CloudInstance

        im = rows(
            inst("i-1", S.REQUESTED, launch="l1"),
            inst("i-2", S.REQUESTED, itype="type-2", launch="l1"),
        )
        out = steps.allocate(im, {"c-1": CloudInstance("c-1", "type-1")}, [])
        assert [(u.instance_id, u.new_status, u.cloud_instance_id) for u in out] == [
            ("i-1", S.ALLOCATED, "c-1")
        ]

    def test_launch_errors_fail_up_to_their_count_per_type(self) -> None:
        from gcs.autoscaler.providers import CloudInstance

        im = rows(
            inst("i-1", S.REQUESTED, launch="l1"),
            inst("i-2", S.REQUESTED, itype="type-2", launch="l1"),
        )
        err = LaunchNodeError("type-2", 1, "l1", 0, "no capacity")
        out = steps.allocate(im, {"c-1": CloudInstance("c-1", "type-1")}, [err])
        assert {(u.instance_id, u.new_status) for u in out} == {
            ("i-1", S.ALLOCATED),
            ("i-2", S.ALLOCATION_FAILED),
        }
        both = [LaunchNodeError("type-1", 1, "l1", 0), LaunchNodeError("type-2", 1, "l1", 0)]
        out = steps.allocate(im, {}, both)
        assert {u.new_status for u in out} == {S.ALLOCATION_FAILED}

    def test_ray_status_new_ray_and_terminated_row_untouched(self) -> None:
        im = rows(
            inst("i-0", S.TERMINATED, cloud="c-1"),
            inst("i-1", S.ALLOCATED, cloud="c-1"),
        )
        out = steps.ray_status(im, [RayNode("r1", RayNodeStatus.RUNNING, instance_id="c-1")])
        assert [(u.instance_id, u.new_status, u.ray_node_id) for u in out] == [
            ("i-1", S.RAY_RUNNING, "r1")
        ]

    def test_ray_status_never_goes_backwards(self) -> None:
        im = rows(
            inst("i-1", S.RAY_RUNNING, cloud="c-1", node="r1"),
            inst("i-2", S.TERMINATING, cloud="c-2", node="r2"),
        )
        nodes = [
            RayNode("r1", RayNodeStatus.IDLE, instance_id="c-1"),
            RayNode("r2", RayNodeStatus.IDLE, instance_id="c-2"),
        ]
        assert steps.ray_status(im, nodes) == []

    def test_unspecified_ray_status_aborts(self) -> None:
        im = rows(inst("i-1", S.ALLOCATED, cloud="c-1"))
        with pytest.raises(steps.UnknownRayNodeStatus):
            steps.ray_status(im, [RayNode("r1", RayNodeStatus.UNSPECIFIED, instance_id="c-1")])

    def test_termination_errors(self) -> None:
        im = rows(inst("i-2", S.TERMINATING, cloud="c-2"))
        out = steps.termination_errors(im, [TerminateNodeError("c-2", "t", 0, "denied")])
        assert [(u.instance_id, u.new_status) for u in out] == [("i-2", S.TERMINATION_FAILED)]


class TestStepPhase:
    @pytest.mark.parametrize("mcl", [1, 10])
    @pytest.mark.parametrize("speed", [0.0, 0.1, 0.5, 1.0, 100.0])
    @pytest.mark.parametrize(("requested", "running"), [(0, 0), (1, 3), (5, 10), (9, 1)])
    def test_max_concurrent_launches(
        self, mcl: int, speed: float, requested: int, running: int
    ) -> None:
        im = {}
        for n in range(1000):
            im[f"q{n}"] = inst(f"q{n}", S.QUEUED, history=[(S.QUEUED, n)])
        for n in range(requested):
            im[f"r{n}"] = inst(f"r{n}", S.REQUESTED, launch="x")
        for n in range(running):
            im[f"u{n}"] = inst(f"u{n}", S.RAY_RUNNING, node=f"n{n}")
        cfg = ReconcileConfig(upscaling_speed=speed, max_concurrent_launches=mcl)
        out = steps.launches(im, cfg, lambda: "l-new")
        expected = min(max(1, math.ceil(speed * max(running, 1))), max(0, mcl - requested))
        assert len(out) == expected
        assert all(u.launch_request_id == "l-new" and u.instance_type == "type-1" for u in out)
        assert [u.instance_id for u in out] == [f"q{n}" for n in range(expected)]

    def test_requeued_instance_keeps_its_launch_request_id(self) -> None:
        im = rows(inst("q", S.QUEUED, launch="old"))
        assert steps.launches(im, ReconcileConfig(), lambda: "new")[0].launch_request_id == "old"

    def test_stuck_requested(self) -> None:
        cfg = ReconcileConfig(request_status_timeout_s=5, max_num_retry_request_to_allocate=1)
        im = rows(
            inst("fresh", S.REQUESTED, history=[(S.QUEUED, 0), (S.REQUESTED, 9)]),
            inst("retry", S.REQUESTED, history=[(S.QUEUED, 0), (S.REQUESTED, 2)]),
            inst(
                "failed",
                S.REQUESTED,
                history=[(S.QUEUED, 0), (S.REQUESTED, 1), (S.QUEUED, 1.5), (S.REQUESTED, 2)],
            ),
        )
        out, _ = steps.stuck(im, cfg, 10 * SEC)
        assert {(u.instance_id, u.new_status) for u in out} == {
            ("retry", S.QUEUED),
            ("failed", S.ALLOCATION_FAILED),
        }

    def test_stuck_ray_stop_requested_returns_to_running(self) -> None:
        cfg = ReconcileConfig(ray_stop_requested_status_timeout_s=5)
        im = rows(
            inst("a", S.RAY_STOP_REQUESTED, node="r-a", history=[(S.RAY_STOP_REQUESTED, 16)]),
            inst("b", S.RAY_STOP_REQUESTED, node="r-b", history=[(S.RAY_STOP_REQUESTED, 14)]),
        )
        out, _ = steps.stuck(im, cfg, 20 * SEC)
        assert [(u.instance_id, u.new_status) for u in out] == [("b", S.RAY_RUNNING)]

    @pytest.mark.parametrize(
        ("status", "then"),
        [
            (S.ALLOCATED, S.ALLOCATION_TIMEOUT),
            (S.RAY_INSTALLING, S.RAY_INSTALL_FAILED),
            (S.TERMINATING, S.TERMINATION_FAILED),
        ],
    )
    def test_stuck_instances_time_out(self, status: S, then: S) -> None:
        cfg = ReconcileConfig(
            allocate_status_timeout_s=5,
            ray_install_status_timeout_s=5,
            terminating_status_timeout_s=5,
        )
        im = rows(inst("i", status, cloud="c", history=[(status, 0)]))
        out, _ = steps.stuck(im, cfg, 10 * SEC)
        assert [u.new_status for u in out] == [then]
        # ... and step 11 takes each of those to TERMINATING
        after = rows(inst("i", then, cloud="c"))
        assert [u.new_status for u in steps.terminate_finished(after)] == [S.TERMINATING]

    @pytest.mark.parametrize("status", [S.RAY_STOPPING, S.QUEUED])
    def test_transient_statuses_warn_once(self, status: S) -> None:
        cfg = ReconcileConfig(transient_status_warn_interval_s=5)
        out, warnings = steps.stuck(rows(inst("i", status, history=[(status, 0)])), cfg, 10 * SEC)
        assert out == [] and len(warnings) == 1

    def test_stuck_no_op_for_other_statuses(self) -> None:
        im = rows(
            *(
                inst(f"i-{s.name}", s, cloud="c", node="n")
                for s in (S.RAY_RUNNING, S.TERMINATED, S.ALLOCATION_FAILED, S.ALLOCATION_TIMEOUT)
            )
        )
        assert steps.stuck(im, ReconcileConfig(), 10**6 * SEC) == ([], [])

    @pytest.mark.parametrize("status", [S.RAY_RUNNING, S.RAY_STOP_REQUESTED, S.RAY_STOPPING])
    def test_missing_ray_node(self, status: S) -> None:
        im = rows(inst("i", status, cloud="c", node="stale"))
        out = steps.missing_ray_nodes(im, set())
        assert [(u.new_status, u.ray_node_id) for u in out] == [(S.RAY_STOPPED, "stale")]

    def test_ray_stopped_shared_cloud_goes_straight_to_terminated(self) -> None:
        im = rows(
            inst("stale", S.RAY_STOPPED, cloud="c-1", node="r-1"),
            inst("live", S.RAY_RUNNING, cloud="c-1", node="r-2"),
        )
        assert [(u.instance_id, u.new_status) for u in steps.terminate_finished(im)] == [
            ("stale", S.TERMINATED)
        ]

    def test_stop_failed(self) -> None:
        im = rows(
            inst("i-1", S.RAY_STOP_REQUESTED, node="r1"),
            inst("i-2", S.RAY_STOP_REQUESTED, node="r2"),
        )
        out = steps.stop_failed(im, {"i-1": "busy"})
        assert [(u.instance_id, u.new_status) for u in out] == [("i-1", S.RAY_RUNNING)]

    def test_scale_updates(self) -> None:
        im = rows(
            inst("head", S.RAY_RUNNING, kind=NodeKind.HEAD, node="h", cloud="ch"),
            inst("i-1", S.RAY_RUNNING, node="r1", cloud="c1"),
            inst("q", S.QUEUED),
            inst("a", S.ALLOCATED, cloud="ca"),
        )
        reply = SchedulingReply(
            launches={"type-1": 2},
            terminations=tuple(
                Termination(iid, "", "type-1", TerminationCause.IDLE, st, "idle", 5000)
                for iid, st in (("i-1", S.RAY_RUNNING), ("q", S.QUEUED), ("a", S.ALLOCATED))
            ),
            infeasible_demands=(),
            infeasible_gangs=(),
            infeasible_constraints=(),
            cluster_resources={},
            reasons=(),
        )
        out = steps.scale(im, reply, new_id_fn())
        got = {(u.instance_id, u.new_status) for u in out}
        assert got == {
            ("i-1", S.RAY_STOP_REQUESTED),
            ("q", S.TERMINATED),
            ("a", S.TERMINATING),
            ("new-100", S.QUEUED),
            ("new-101", S.QUEUED),
        }
        stop = next(u for u in out if u.instance_id == "i-1")
        assert stop.termination is not None and stop.termination.cause == "IDLE"


# -- whole rounds on fakes ----------------------------------------------------------------
CLUSTER = parse_cluster_config(
    {
        "head_node_type": "head",
        "max_workers": 10,
        "idle_timeout_minutes": 1,
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "max_workers": 0},
            "type-1": {"resources": {"CPU": 4}, "max_workers": 10},
            "type-2": {"resources": {"CPU": 8}, "max_workers": 10},
        },
    }
)


class Harness:
    def __init__(
        self,
        *instances: Instance,
        cfg: ReconcileConfig | None = None,
        gcs: Any = None,
        cluster: ClusterConfig = CLUSTER,
    ) -> None:
        self.clock = SteppedClock()
        self.storage = MemoryInstanceStorage()
        for i in instances:
            self.storage.rows[i.instance_id] = i
        self.events = EventLog(self.clock)
        self.provider = FakeCloudProvider(self.clock)
        self.gcs = FakeAutoscalerGcs() if gcs is None else gcs
        self.updater = CloudInstanceUpdater(self.provider, self.clock, self.events)
        self.stopper = RayStopper(self.gcs, self.events)
        self.im = InstanceManager(
            self.storage, self.clock, subscribers=[self.updater, self.stopper]
        )
        self.reconciler = Reconciler(
            instances=self.im,
            provider=self.provider,
            gcs=self.gcs,
            cluster=cluster,
            clock=self.clock,
            events=self.events,
            updater=self.updater,
            stopper=self.stopper,
            config=cfg,
            new_instance_id=new_id_fn(),
            schedule_in_thread=False,
        )

    def node(self, node_id: str, status: int, cloud: str, node_type: str = "type-1", **kw):  # type: ignore[no-untyped-def]
        ns = self.gcs.state.node_states.add(
            node_id=bytes.fromhex(node_id),
            status=status,
            instance_id=cloud,
            ray_node_type_name=node_type,
            **kw,
        )
        return ns

    async def round(self):  # type: ignore[no-untyped-def]
        result = await self.reconciler.reconcile_once()
        await self.updater.settle()
        await self.stopper.settle()
        return result

    def statuses(self) -> dict[str, S]:
        return {iid: i.status for iid, i in self.im.instances.items()}


def with_running_head(*instances: Instance, cluster: ClusterConfig = CLUSTER) -> Harness:
    """A harness whose head instance runs (cloud ``ch``, Ray node ``aa``), plus ``instances``."""
    h = Harness(
        inst("head", S.RAY_RUNNING, cloud="ch", node="aa", kind=NodeKind.HEAD, itype="head"),
        *instances,
        cluster=cluster,
    )
    h.provider.add("ch", "head", NodeKind.HEAD)
    h.node("aa", autoscaler_pb2.IDLE, "ch", "head", total_resources={"node:__internal_head__": 1})
    return h


class TestRounds:
    async def test_stopped_ray_terminates_in_the_same_round(self) -> None:
        h = Harness(
            inst("i-1", S.ALLOCATED, cloud="c1"),
            inst("i-2", S.RAY_STOPPING, cloud="c2", node="02"),
            inst("i-3", S.TERMINATING, cloud="c3", node="03"),
        )
        for cid in ("c1", "c2", "c3"):
            h.provider.add(cid, "type-1")
        h.node("01", autoscaler_pb2.DEAD, "c1")
        h.node("02", autoscaler_pb2.DEAD, "c2")
        h.node("03", autoscaler_pb2.DEAD, "c3")
        await h.reconciler.reconcile_once()
        assert h.statuses() == {
            "i-1": S.TERMINATING,
            "i-2": S.TERMINATING,
            "i-3": S.TERMINATING,
        }

    async def test_ray_node_restarted_on_the_same_cloud_instance(self) -> None:
        h = Harness(inst("i-1", S.RAY_RUNNING, cloud="c1", node="01"))
        h.provider.add("c1", "type-1")
        h.node("02", autoscaler_pb2.IDLE, "c1")
        h.node("01", autoscaler_pb2.DEAD, "c1")
        await h.reconciler.reconcile_once()
        st = h.statuses()
        assert st["i-1"] is S.TERMINATED
        [new] = [i for i in h.im.instances.values() if i.instance_id != "i-1"]
        assert new.status is S.RAY_RUNNING and new.node_id == "02"
        assert [e[0] for e in h.provider.terminate_calls] == []  # no cloud termination

    async def test_cloud_instance_reboot_is_adopted(self) -> None:
        h = Harness(inst("i-1", S.TERMINATED, cloud="c1", node="01"))
        h.provider.add("c1", "type-1")
        h.node("01", autoscaler_pb2.DEAD, "c1")
        await h.reconciler.reconcile_once()
        assert sorted(h.statuses().values()) == [S.ALLOCATED, S.TERMINATED]

    async def test_a_running_head_the_provider_lists_is_adopted_as_head(self) -> None:
        """A KubeRay head pod runs before the autoscaler: its raylet need not carry the
        head resource for the adopted instance to be the head (never idle-terminated)."""
        h = Harness()
        h.provider.add("ch", "head", NodeKind.HEAD)
        h.node("aa", autoscaler_pb2.IDLE, "ch", "head")
        await h.reconciler.reconcile_once()
        (adopted,) = h.im.instances.values()
        assert adopted.node_kind is NodeKind.HEAD

    async def test_scale_up_then_idle_drain_and_termination(self) -> None:
        h = with_running_head()
        h.gcs.state.pending_resource_requests.add(
            request=autoscaler_pb2.ResourceRequest(resources_bundle={"CPU": 6}), count=2
        )
        await h.round()  # scheduler queues 2 x type-2; launch rate releases 1 (speed 0)
        assert sorted(s.name for s in h.statuses().values()).count("REQUESTED") == 1
        assert h.provider.launch_calls and h.provider.launch_calls[0][0] == {"type-2": 1}
        await h.round()  # allocated; second one requested
        await h.round()
        allocated = [i for i in h.im.instances.values() if i.status is S.ALLOCATED]
        assert len(allocated) == 2
        # raylets come up on both, the work finishes, they go idle past the timeout
        del h.gcs.state.pending_resource_requests[:]
        for n, i in enumerate(allocated):
            h.node(
                f"b{n}",
                autoscaler_pb2.IDLE,
                i.cloud_instance_id,
                idle_duration_ms=120_000,
                total_resources={"CPU": 4},
                available_resources={"CPU": 4},
            )
        h.gcs.busy.add("b1")  # one raylet has work again and refuses the idle drain
        await h.round()
        assert sorted(h.gcs.drains) == ["b0", "b1"]
        stop_requested = [i for i in h.im.instances.values() if i.status is S.RAY_STOP_REQUESTED]
        assert len(stop_requested) == 2
        await h.round()  # b1's rejection puts it back to RAY_RUNNING; b0 drains
        by_node = {i.node_id: i.status for i in h.im.instances.values()}
        assert by_node["b1"] in (S.RAY_RUNNING, S.RAY_STOP_REQUESTED)
        # b0's raylet exits after the accepted drain
        for ns in h.gcs.state.node_states:
            if ns.node_id == bytes.fromhex("b0"):
                ns.status = autoscaler_pb2.DEAD
        await h.round()
        b0 = next(i for i in h.im.instances.values() if i.node_id == "b0")
        assert b0.status in (S.TERMINATING, S.TERMINATED)
        assert any(b0.cloud_instance_id in ids for ids, _ in h.provider.terminate_calls)
        assert b0.cloud_instance_id not in h.provider.instances
        kinds = [e.kind for e in h.events.recent(50)]
        assert "launch" in kinds and "drain" in kinds and "drain-rejected" in kinds
        assert "terminate" in kinds
        report = h.gcs.reports[-1]
        assert report.autoscaler_state_version == h.im.version

    @staticmethod
    async def _two_of_three_stopped_then_reported(
        type_1: dict[str, int], idle_base_ms: int, sent: str
    ) -> Harness:
        """3 idle workers of type-1 (``type_1``: its min/max); round 1 stops the 2 longest
        idle (``sent``: "drains" or "stops" on the fake GCS); round 2 still sees them IDLE
        and must stop nothing more; round 3 they report DRAINING."""
        cluster = parse_cluster_config(
            {
                "head_node_type": "head",
                "max_workers": 10,
                "idle_timeout_minutes": 1,
                "available_node_types": {
                    "head": {"resources": {"CPU": 0}, "max_workers": 0},
                    "type-1": {"resources": {"CPU": 4}, **type_1},
                },
            }
        )
        workers = [inst(f"w{n}", S.RAY_RUNNING, cloud=f"c{n}", node=f"b{n}") for n in range(3)]
        h = with_running_head(*workers, cluster=cluster)
        for n in range(3):
            h.provider.add(f"c{n}", "type-1")
            h.node(
                f"b{n}",
                autoscaler_pb2.IDLE,
                f"c{n}",
                idle_duration_ms=idle_base_ms + n * 1000,
                total_resources={"CPU": 4},
                available_resources={"CPU": 4},
            )
        for _ in range(2):  # round 2: the stops went out; the GCS still says IDLE
            await h.round()
            assert sorted(getattr(h.gcs, sent)) == ["b1", "b2"]
            assert h.statuses()["w0"] is S.RAY_RUNNING
        for ns in h.gcs.state.node_states:
            if ns.node_id.hex() in ("b1", "b2"):
                ns.status = autoscaler_pb2.DRAINING
        await h.round()
        assert sorted(getattr(h.gcs, sent)) == ["b1", "b2"]
        assert {i: s for i, s in h.statuses().items() if i.startswith("w")} == {
            "w0": S.RAY_RUNNING,
            "w1": S.RAY_STOPPING,
            "w2": S.RAY_STOPPING,
        }
        return h

    async def test_idle_drains_not_yet_reported_do_not_take_a_type_below_min(self) -> None:
        """The local end-to-end race: 3 idle workers, min_workers 1.  Round 1 drains 2;
        the GCS still reports them IDLE in round 2 (a raylet reports draining a little
        later), which must not drain the third; then they report DRAINING: no relaunch."""
        h = await self._two_of_three_stopped_then_reported(
            {"min_workers": 1, "max_workers": 10}, idle_base_ms=120_000, sent="drains"
        )
        assert h.provider.launch_calls == []  # nothing relaunched for min_workers

    async def test_max_workers_drains_not_yet_reported_do_not_take_a_type_below_max(
        self,
    ) -> None:
        """max_workers lowered to 1 with 3 workers: round 1 stops the 2 longest idle; the GCS
        still reports them IDLE in round 2, which must not stop the third (counting them
        as present, 3 > 1 chose it: it sorts before nodes just asked to stop)."""
        h = await self._two_of_three_stopped_then_reported(
            {"max_workers": 1},
            idle_base_ms=10_000,
            sent="stops",  # idle, not past the timeout
        )
        assert h.gcs.drains == [] and h.provider.launch_calls == []

    async def test_provider_failures_cost_one_round_and_show_as_failed(self) -> None:
        h = with_running_head()
        h.gcs.state.pending_resource_requests.add(
            request=autoscaler_pb2.ResourceRequest(resources_bundle={"CPU": 8}), count=1
        )
        h.provider.raise_on_list = RuntimeError("cloud API down")
        assert await h.reconciler.reconcile_safely() is None
        assert h.reconciler.failed_rounds == 1 and "cloud API down" in h.reconciler.last_error
        h.provider.next_launch_error = "quota exceeded"
        await h.round()
        await h.round()
        failed = [i for i in h.im.instances.values() if i.status is S.ALLOCATION_FAILED]
        assert len(failed) == 1 and "quota exceeded" in failed[0].latest_details()
        report = h.gcs.reports[-1]
        assert [f.reason for f in report.failed_instance_requests] == ["quota exceeded"]

    async def test_what_the_provider_says_in_words_becomes_an_event_once(self) -> None:
        h = with_running_head()
        h.provider.notices.append("EC2 throttled 3 calls (RequestLimitExceeded): retried")
        await h.round()
        await h.round()
        said = [e.message for e in h.events.recent() if e.kind == "provider"]
        assert said == ["EC2 throttled 3 calls (RequestLimitExceeded): retried"]

    async def test_hanging_provider_launch_becomes_a_launch_error(self) -> None:
        """The call timeout runs on the injected clock: the launch hangs until the test
        moves time past it."""
        h = with_running_head()
        h.gcs.state.pending_resource_requests.add(
            request=autoscaler_pb2.ResourceRequest(resources_bundle={"CPU": 4}), count=1
        )
        h.provider.hang_next_launch = True
        await h.reconciler.reconcile_once()
        settled = asyncio.ensure_future(h.updater.settle())
        await h.clock.advance_when_sleeping(59.0)
        assert not settled.done() and h.updater.poll_errors() == []  # not yet timed out
        h.clock.advance(1.0)
        await settled
        await h.round()
        failed = [i for i in h.im.instances.values() if i.status is S.ALLOCATION_FAILED]
        assert len(failed) == 1 and "did not answer" in failed[0].latest_details()

    async def test_no_scaling_without_a_running_head(self) -> None:
        h = Harness()
        h.gcs.state.pending_resource_requests.add(
            request=autoscaler_pb2.ResourceRequest(resources_bundle={"CPU": 4}), count=1
        )
        await h.round()
        assert h.im.instances == {} and h.provider.launch_calls == []

    async def test_infeasible_demand_is_reported(self) -> None:
        h = with_running_head()
        h.gcs.state.pending_resource_requests.add(
            request=autoscaler_pb2.ResourceRequest(resources_bundle={"GPU": 1}), count=3
        )
        result = await h.round()
        assert len(result.state.infeasible_resource_requests) == 3


class TestVirtualClusters:
    async def test_a_node_held_by_a_virtual_cluster_is_released_not_terminated(self) -> None:
        """Idle past the timeout but held by vc1: no drain; it goes back to the primary.
        Once the primary holds it, the next round drains it."""
        h = with_running_head(inst("w", S.RAY_RUNNING, cloud="cw", node="b0"))
        h.provider.add("cw", "type-1")
        h.node(
            "b0",
            autoscaler_pb2.IDLE,
            "cw",
            idle_duration_ms=600_000,
            total_resources={"CPU": 4},
            available_resources={"CPU": 4},
        )
        h.gcs.state.virtual_cluster_states["vc1"].nodes.append("b0")
        h.gcs.state.virtual_cluster_states["kPrimaryClusterID"].nodes.append("aa")
        await h.round()
        assert h.gcs.drains == [] and h.statuses()["w"] is S.RAY_RUNNING
        assert h.gcs.releases == [("vc1", ["b0"])]
        await h.round()  # the primary holds it now
        assert h.gcs.drains == ["b0"]
        assert "release" in [e.kind for e in h.events.recent(20)]


async def test_a_ray_node_on_a_machine_the_provider_does_not_run_is_not_adopted() -> None:
    """Ray would adopt it and mark it TERMINATED again every round (the cloud does not list
    it); ours leaves it alone as an unmanaged node."""
    h = with_running_head()
    h.node("cc", autoscaler_pb2.IDLE, "by-hand-1", "type-1", total_resources={"CPU": 4})
    for _ in range(3):
        await h.round()
    assert sorted(h.im.instances) == ["head"]
