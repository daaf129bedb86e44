"""Virtual-cluster-aware scaling: the pure policy, and the reconciler on fakes."""

from __future__ import annotations

import json

from gcs.autoscaler.instances import StatusHistory
from gcs.autoscaler.reconciler import vc_scaling
from gcs.cli.status import render_events
from gcs.policy.autoscaling.model import InstanceStatus as S
from gcs.policy.autoscaling.model import NodeKind, RayNode, RayNodeStatus
from gcs.policy.autoscaling.scheduler import schedule
from gcs.policy.autoscaling.scheduler.types import SchedulingInput, SchedulingReply
from gcs.proto import autoscaler_pb2
from tests.autoscaler.test_reconciler import CLUSTER, Harness, inst, rows, with_running_head

PRIMARY = "kPrimaryClusterID"


def demand(
    state: autoscaler_pb2.ClusterResourceState | autoscaler_pb2.VirtualClusterState,
    cpus: float,
    count: int,
) -> None:
    state.pending_resource_requests.add(
        request=autoscaler_pb2.ResourceRequest(resources_bundle={"CPU": cpus}), count=count
    )


def vc_demand(h: Harness, cpus: float, count: int, cluster_id: str = "vc1") -> None:
    """Demand of a VC as our GCS reports it: per VC and in the cluster-wide sum."""
    demand(h.gcs.state.virtual_cluster_states[cluster_id], cpus, count)
    demand(h.gcs.state, cpus, count)


def worker(h: Harness, node_id: str, cloud: str, *, busy: bool, node_type: str = "type-1") -> None:
    """A managed RAY_RUNNING worker of 4 CPUs (8 for type-2), busy or idle for 10 minutes."""
    cpus = 8.0 if node_type == "type-2" else 4.0
    h.storage.rows[f"i-{node_id}"] = inst(
        f"i-{node_id}", S.RAY_RUNNING, cloud=cloud, node=node_id, itype=node_type
    )
    h.provider.add(cloud, node_type)
    h.node(
        node_id,
        autoscaler_pb2.RUNNING if busy else autoscaler_pb2.IDLE,
        cloud,
        node_type,
        idle_duration_ms=0 if busy else 600_000,
        total_resources={"CPU": cpus},
        available_resources={"CPU": 0.0 if busy else cpus},
    )


def clusters(h: Harness, vc_nodes: list[str], primary_nodes: list[str], **config):  # type: ignore[no-untyped-def]
    states = h.gcs.state.virtual_cluster_states
    states[PRIMARY].divisible = True
    states[PRIMARY].nodes.extend(["aa", *primary_nodes])
    vc = states["vc1"]
    vc.revision = 5
    vc.nodes.extend(vc_nodes)
    vc.min_replica_sets.update(config.get("min", {}))
    vc.max_replica_sets.update(config.get("max", {}))
    vc.max_nodes = config.get("max_nodes", 0)
    return vc


def launched(h: Harness) -> list[dict[str, int]]:
    return [shape for shape, _ in h.provider.launch_calls]


def kinds(h: Harness) -> list[str]:
    return [e.kind for e in h.events.recent(100)]


def one_free_primary_node():  # type: ignore[no-untyped-def]
    """vc1 holds busy b0 (type-1) and asks for 4 CPUs more; the primary has free c0."""
    h = with_running_head()
    worker(h, "b0", "cb0", busy=True)
    worker(h, "c0", "cc0", busy=False)
    vc = clusters(h, ["b0"], ["c0"])
    vc_demand(h, 4, 1)
    return h, vc


class TestReconciler:
    async def test_demand_is_served_by_moving_a_free_primary_node_not_a_launch(self) -> None:
        h, vc = one_free_primary_node()
        await h.round()
        assert h.gcs.updates == [("vc1", {"type-1": 2}, 5)]
        assert "c0" in vc.nodes and "c0" not in h.gcs.state.virtual_cluster_states[PRIMARY].nodes
        assert launched(h) == [] and h.gcs.drains == []  # no launch; the moved node is kept
        assert "vc-move" in kinds(h)
        assert all(i.status is S.RAY_RUNNING for i in h.im.instances.values())
        shown = render_events(json.loads(h.events.to_json()))  # what `gcs status` prints
        assert "Moved node(s) c0 into virtual cluster vc1: move 1 x type-1" in shown

    async def test_no_free_primary_node_launches_the_replica_set_type_then_moves_it(self) -> None:
        h = with_running_head()
        worker(h, "b0", "cb0", busy=True, node_type="type-2")
        worker(h, "c0", "cc0", busy=True)  # a primary type-1 node, but busy
        vc = clusters(h, ["b0"], ["c0"])
        vc_demand(h, 4, 1)
        await h.round()
        # the VC names type-2 only (its members); the primary scheduler launches nothing
        assert launched(h) == [{"type-2": 1}]
        [new] = [
            i for i in h.im.instances.values() if i.instance_type == "type-2" and not i.node_id
        ]
        assert vc_scaling.destined_cluster(new) == "vc1"
        await h.round()
        await h.round()
        assert launched(h) == [{"type-2": 1}]  # the launch in flight counts: no second one
        new = h.im.instances[new.instance_id]
        assert new.status is S.ALLOCATED
        # its raylet joins the primary, idle
        h.node(
            "d0",
            autoscaler_pb2.IDLE,
            new.cloud_instance_id,
            "type-2",
            idle_duration_ms=1000,
            total_resources={"CPU": 8},
            available_resources={"CPU": 8},
        )
        h.gcs.state.virtual_cluster_states[PRIMARY].nodes.append("d0")
        await h.round()
        assert "d0" in vc.nodes
        assert h.gcs.updates[-1] == ("vc1", {"type-2": 2}, 5)
        assert h.im.instances[new.instance_id].status is S.RAY_RUNNING
        assert launched(h) == [{"type-2": 1}]
        assert "vc-launch" in kinds(h) and "vc-move" in kinds(h)

    async def test_a_revision_conflict_is_re_read_and_retried(self) -> None:
        h, vc = one_free_primary_node()
        h.gcs.expire_next = 2
        await h.round()
        assert [u[2] for u in h.gcs.updates] == [5, 6, 7]  # each retry read the new revision
        assert "c0" in vc.nodes and "vc-failed" not in kinds(h)

    async def test_endless_conflicts_give_up_for_the_round(self) -> None:
        h, vc = one_free_primary_node()
        h.gcs.expire_next = 10
        await h.round()
        assert len(h.gcs.updates) == 3
        assert "c0" not in vc.nodes and "vc-failed" in kinds(h)
        assert launched(h) == []  # the free node is still there: no launch instead

    async def test_max_nodes_and_max_replica_sets_are_honoured(self) -> None:
        h = with_running_head()
        worker(h, "b0", "cb0", busy=True)
        worker(h, "b1", "cb1", busy=True)
        worker(h, "c0", "cc0", busy=False)
        vc = clusters(h, ["b0", "b1"], ["c0"], min={"type-1": 0}, max={"type-1": 3}, max_nodes=2)
        vc_demand(h, 4, 3)
        await h.round()
        await h.round()
        assert h.gcs.updates == [] and launched(h) == []
        assert sorted(vc.nodes) == ["b0", "b1"]
        # per type: max_replica_sets type-1 = 2 caps it the same way
        h2 = with_running_head()
        worker(h2, "b0", "cb0", busy=True)
        worker(h2, "c0", "cc0", busy=False)
        clusters(h2, ["b0"], ["c0"], min={"type-1": 0}, max={"type-1": 1}, max_nodes=5)
        vc_demand(h2, 4, 2)
        await h2.round()
        assert h2.gcs.updates == [] and launched(h2) == []

    async def test_min_replica_sets_are_kept(self) -> None:
        """An empty VC with min type-2 = 1 takes a free primary type-2 node, no demand needed."""
        h = with_running_head()
        worker(h, "c0", "cc0", busy=False, node_type="type-2")
        vc = clusters(h, [], ["c0"], min={"type-2": 1}, max={"type-2": 2}, max_nodes=2)
        await h.round()
        assert list(vc.nodes) == ["c0"] and launched(h) == []
        await h.round()  # idle past the timeout, but the min keeps it
        assert h.gcs.releases == [] and h.gcs.drains == []

    async def test_idle_vc_node_goes_back_to_the_primary_then_is_terminated(self) -> None:
        h = with_running_head()
        worker(h, "b0", "cb0", busy=False)
        worker(h, "b1", "cb1", busy=False)
        vc = clusters(h, ["b0", "b1"], [], min={"type-1": 1}, max={"type-1": 4}, max_nodes=4)
        await h.round()
        [(cluster_id, [gone])] = h.gcs.releases
        assert cluster_id == "vc1" and len(vc.nodes) == 1  # the min keeps one
        assert h.gcs.drains == []  # released, not terminated, in the same round
        await h.round()
        assert h.gcs.drains == [gone]
        assert h.gcs.releases == [("vc1", [gone])]
        stopping = [i for i in h.im.instances.values() if i.node_id == gone]
        assert stopping[0].status in (S.RAY_STOP_REQUESTED, S.RAY_STOPPING, S.RAY_STOPPED)
        assert "release" in kinds(h)


class TestPolicy:
    def nodes(self) -> list[RayNode]:
        def node(nid: str, t: str, free: bool, status: RayNodeStatus = RayNodeStatus.IDLE):  # type: ignore[no-untyped-def]
            return RayNode(
                nid, status, node_type=t, total={"CPU": 4}, available={"CPU": 4 if free else 0}
            )

        return [
            RayNode("aa", RayNodeStatus.IDLE, node_type="head", is_head=True),
            node("b0", "type-1", False, RayNodeStatus.RUNNING),
            node("c0", "type-1", True),
            node("c1", "type-1", True),
            node("c2", "type-2", True),
        ]

    def state(self) -> autoscaler_pb2.ClusterResourceState:
        state = autoscaler_pb2.ClusterResourceState()
        state.virtual_cluster_states[PRIMARY].divisible = True
        state.virtual_cluster_states[PRIMARY].nodes.extend(["aa", "c0", "c1", "c2"])
        state.virtual_cluster_states["vc1"].nodes.append("b0")
        return state

    def test_free_primary_nodes_by_type_lowest_id_first(self) -> None:
        im = rows(inst("i-c1", S.RAY_STOP_REQUESTED, node="c1"))
        pool = vc_scaling.free_primary_nodes(self.state(), {n.node_id: n for n in self.nodes()}, im)
        assert dict(pool) == {"type-1": ["c0"], "type-2": ["c2"]}  # c1 is being stopped

    def test_pool_is_shared_between_clusters_in_id_order(self) -> None:
        state = self.state()
        state.virtual_cluster_states["vc2"].nodes.append("b0")
        for cid in ("vc1", "vc2"):
            demand(state.virtual_cluster_states[cid], 4, 2)
        plan = vc_scaling.plan_virtual_clusters(state, {}, self.nodes(), CLUSTER, 0.0, schedule)
        assert [(g.cluster_id, dict(g.add)) for g in plan.grows] == [("vc1", {"type-1": 2})]
        assert [(x.cluster_id, x.node_type, x.count) for x in plan.launches] == [
            ("vc2", "type-1", 2)
        ]
        assert plan.planned == {"vc1", "vc2"} and plan.held == {"b0"}

    def test_divisible_and_job_clusters_are_not_scaled(self) -> None:
        state = self.state()
        state.virtual_cluster_states["vc1"].divisible = True
        state.virtual_cluster_states["vc1##job"].parent_virtual_cluster_id = "vc1"
        demand(state.virtual_cluster_states["vc1##job"], 4, 1)
        assert (
            vc_scaling.plan_virtual_clusters(state, {}, self.nodes(), CLUSTER, 0.0, schedule)
            == vc_scaling.VcPlan()
        )

    def test_launches_respect_the_cluster_max_workers(self) -> None:
        state = self.state()
        state.virtual_cluster_states["vc1"].max_replica_sets["type-1"] = 50
        state.virtual_cluster_states["vc1"].min_replica_sets["type-1"] = 0
        state.virtual_cluster_states["vc1"].max_nodes = 50
        demand(state.virtual_cluster_states["vc1"], 4, 30)
        plan = vc_scaling.plan_virtual_clusters(state, {}, self.nodes(), CLUSTER, 0.0, schedule)
        moved = sum(g.add.get("type-1", 0) for g in plan.grows)
        # the VC's own cap: type-1 max_workers 10 (b0 + 2 moved + 7 launched)
        assert moved == 2 and plan.launch_counts == {"type-1": 7}
        # 8 type-1 instances elsewhere in the cluster leave room for 2 launches
        others = rows(*(inst(f"o{i}", S.RAY_RUNNING) for i in range(8)))
        plan = vc_scaling.plan_virtual_clusters(state, others, self.nodes(), CLUSTER, 0.0, schedule)
        assert plan.launch_counts == {"type-1": 2}
        assert any(d.action == "capped" for d in plan.decisions)

    def test_min_of_one_type_never_grows_past_max_nodes(self) -> None:
        """vc1 holds a type-1 node and now wants min 1 x type-2 within max_nodes 1: adding
        one would make 2 nodes; it waits (capped) instead."""
        state = self.state()
        vc = state.virtual_cluster_states["vc1"]
        vc.min_replica_sets["type-2"] = 1
        vc.max_replica_sets["type-2"] = 1
        vc.max_nodes = 1
        plan = vc_scaling.plan_virtual_clusters(state, {}, self.nodes(), CLUSTER, 0.0, schedule)
        assert plan.grows == () and plan.launches == ()
        assert any(d.subject.startswith("vc1") for d in plan.decisions)

        def eager(inp: SchedulingInput) -> SchedulingReply:  # asks past every cap
            return SchedulingReply({"type-2": 3}, (), (), (), (), {}, ())

        plan = vc_scaling.plan_virtual_clusters(state, {}, self.nodes(), CLUSTER, 0.0, eager)
        assert plan.grows == () and plan.launches == ()
        assert any(d.action == "capped" for d in plan.decisions)
        vc.max_nodes = 3  # b0 + 2 more, but type-2's max is 1
        plan = vc_scaling.plan_virtual_clusters(state, {}, self.nodes(), CLUSTER, 0.0, eager)
        assert [dict(g.add) for g in plan.grows] == [{"type-2": 1}] and plan.launches == ()

    def test_releases_keep_the_min_whatever_the_scheduler_terminates(self) -> None:
        """Over max_nodes, Ray's max enforcement may pick the min type's node: it stays."""
        nodes = [
            RayNode("aa", RayNodeStatus.IDLE, node_type="head", is_head=True),
            RayNode("b0", RayNodeStatus.IDLE, node_type="type-1", total={"CPU": 4},
                    available={"CPU": 4}, idle_duration_ms=10_000),
            RayNode("b1", RayNodeStatus.IDLE, node_type="type-2", total={"CPU": 8},
                    available={"CPU": 8}, idle_duration_ms=900_000),
        ]  # fmt: skip
        state = autoscaler_pb2.ClusterResourceState()
        state.virtual_cluster_states[PRIMARY].nodes.append("aa")
        vc = state.virtual_cluster_states["vc1"]
        vc.nodes.extend(["b0", "b1"])
        vc.min_replica_sets["type-2"] = 1
        vc.max_replica_sets["type-2"] = 1
        vc.max_nodes = 1
        plan = vc_scaling.plan_virtual_clusters(state, {}, nodes, CLUSTER, 0.0, schedule)
        released = plan.releases.get("vc1", ())
        assert "b1" not in released  # the scheduler picks b1 (idle longest); the min keeps it

    def test_in_flight_launches_count(self) -> None:
        state = self.state()
        del state.virtual_cluster_states[PRIMARY].nodes[1:]  # no free primary node
        demand(state.virtual_cluster_states["vc1"], 4, 2)
        queued = inst("q", S.REQUESTED, history=[(S.QUEUED, 0), (S.REQUESTED, 1)])
        queued = type(queued)(
            "q",
            S.REQUESTED,
            "type-1",
            NodeKind.WORKER,
            history=(StatusHistory(S.QUEUED, 0, vc_scaling.queued_details("vc1", "x")),),
        )
        plan = vc_scaling.plan_virtual_clusters(
            state, rows(queued), self.nodes(), CLUSTER, 0.0, schedule
        )
        assert plan.launch_counts == {"type-1": 1}

    def test_primary_demand_subtracts_what_the_clusters_ask(self) -> None:
        state = self.state()
        demand(state, 4, 5)
        demand(state, 2, 1)
        demand(state.virtual_cluster_states["vc1"], 4, 3)
        gang = autoscaler_pb2.GangResourceRequest(details="pg1:PACK|PENDING")
        gang.requests.add(resources_bundle={"CPU": 1})
        state.pending_gang_resource_requests.add().CopyFrom(gang)
        state.virtual_cluster_states["vc1"].pending_gang_resource_requests.add().CopyFrom(gang)
        out = vc_scaling.primary_demand(state, frozenset({"vc1"}))
        left = out.pending_resource_requests
        got = {(dict(r.request.resources_bundle)["CPU"], r.count) for r in left}
        assert got == {(4.0, 2), (2.0, 1)}
        assert len(out.pending_gang_resource_requests) == 0
        assert len(state.pending_resource_requests) == 2  # input untouched
