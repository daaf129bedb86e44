"""KubeRay in-place pod resize (IPPR) in the scheduler, Ray 2.60 semantics (autoscaler-v2 §3)."""

from __future__ import annotations

from dataclasses import replace

from gcs.policy.autoscaling.model import InstanceStatus
from gcs.policy.autoscaling.scheduler import (
    IpprSpec,
    IpprStatus,
    NodeInstance,
    NodeTypeConfig,
    ResourceDemand,
    SchedulerConfig,
    SchedulingInput,
    schedule,
)

GI = 2**30
SPEC = IpprSpec(max_cpu=4, max_memory=12 * GI, min_cpu=1, min_memory=GI, resize_timeout_s=60)


def group(ippr: IpprSpec | None = SPEC, **kw: object) -> NodeTypeConfig:
    return NodeTypeConfig(
        "w",
        {"CPU": 1, "memory": 4 * GI},
        max_workers=kw.pop("mx", 10),
        ippr=ippr,
        **kw,  # type: ignore[arg-type]
    )


def pod(
    iid: str, *, free_cpu: float = 1, status: IpprStatus | None = None, **kw: object
) -> NodeInstance:
    total = {"CPU": 1.0, "memory": 4.0 * GI}
    return NodeInstance(
        instance_id=iid,
        node_type="w",
        ray_node_id=f"r{iid}",
        total=total,
        available={"CPU": free_cpu, "memory": 4.0 * GI},
        cloud_instance_id=f"pod-{iid}",
        ippr=status if status is not None else IpprStatus(1, 4 * GI),
        **kw,  # type: ignore[arg-type]
    )


def inp(types: list[NodeTypeConfig], nodes: list[NodeInstance], *cpus: float) -> SchedulingInput:
    return SchedulingInput(
        SchedulerConfig({t.name: t for t in types}),
        tuple(nodes),
        tuple(ResourceDemand({"CPU": c}) for c in cpus),
    )


class TestResizeInsteadOfLaunch:
    """After existing nodes are filled, resizable pods are offered at their IPPR max."""

    def test_idle_pod_is_resized_to_its_max_instead_of_launching(self) -> None:
        """Doc case 1: a CPU:2 task on a 1-CPU pod (max 4): resize both dims to max, no launch."""
        reply = schedule(inp([group()], [pod("a")], 2))
        assert reply.launches == {}
        assert [(r.instance_id, r.cpu, r.memory) for r in reply.resizes] == [("a", 4, 12 * GI)]
        r = reply.resizes[0]
        assert (r.cloud_instance_id, r.ray_node_id, r.current_cpu) == ("pod-a", "ra", 1)
        assert "IPPR max" in r.reason and "1 x {CPU:2}" in r.reason
        assert reply.cluster_resources == {"CPU": 4, "memory": 12 * GI}

    def test_resize_and_scale_out_when_one_pod_is_not_enough(self) -> None:
        """Doc case 2: CPU:2 + CPU:4 -> resize the pod (takes CPU:4), launch one for CPU:2."""
        reply = schedule(inp([group()], [pod("a")], 2, 4))
        assert len(reply.resizes) == 1
        assert reply.launches == {"w": 1}
        launch = next(d for d in reply.reasons if d.action == "launch")
        assert "counted at its IPPR max" in launch.reason

    def test_new_nodes_count_at_ippr_max(self) -> None:
        """Doc case 3: no pod, CPU:2 on a 1-CPU type: launch (it can grow); no spec: infeasible."""
        assert schedule(inp([group()], [], 2)).launches == {"w": 1}
        plain = schedule(inp([group(ippr=None)], [], 2))
        assert plain.launches == {} and len(plain.infeasible_demands) == 1

    def test_request_beyond_max_is_infeasible(self) -> None:
        """CPU:5 fits neither the resized pod nor a new one at max 4."""
        reply = schedule(inp([group()], [pod("a")], 5))
        assert reply.resizes == () and reply.launches == {}
        assert len(reply.infeasible_demands) == 1

    def test_free_capacity_is_used_before_resizing(self) -> None:
        """A pod with room takes the task at its current size; nothing is resized."""
        roomy = replace(pod("b"), total={"CPU": 2.0, "memory": 4.0 * GI}, available={"CPU": 2})
        reply = schedule(inp([group()], [pod("a"), roomy], 2))
        assert reply.resizes == () and reply.launches == {}

    def test_suggested_cap_wins_over_spec_max(self) -> None:
        """A deferred resize suggested CPU 2: the pod is resized to 2, not 4."""
        st = IpprStatus(1, 4 * GI, suggested_max_cpu=2.0)
        reply = schedule(inp([group()], [pod("a", status=st)], 1.5))
        assert [(r.cpu, r.memory) for r in reply.resizes] == [(2, 12 * GI)]
        assert "suggested" in reply.resizes[0].reason


class TestResizeState:
    """Which pods may be resized, and how in-flight resizes count."""

    def test_in_flight_resize_counts_at_desired_size(self) -> None:
        """Sent at t=100, not yet synced: the pod counts as 4 CPU; no new resize, no launch."""
        st = IpprStatus(1, 4 * GI, desired_cpu=4, desired_memory=12 * GI, resizing_at=100)
        reply = schedule(inp([group()], [pod("a", status=st)], 3))
        assert reply.resizes == () and reply.launches == {}
        assert reply.cluster_resources["CPU"] == 4

    def test_pod_that_failed_a_resize_is_never_resized_up(self) -> None:
        """last_failed_at set: demand goes to a new pod instead."""
        st = IpprStatus(1, 4 * GI, last_failed_at=50, last_failed_reason="Pod resize timed out")
        reply = schedule(inp([group()], [pod("a", status=st)], 2))
        assert reply.resizes == () and reply.launches == {"w": 1}

    def test_provider_queued_revert_is_sent_with_its_reason(self) -> None:
        """A revert the provider queued (status "new") goes out with the failure named."""
        st = IpprStatus(
            4, 12 * GI, desired_cpu=1, desired_memory=4 * GI, k8s_resize_status="new",
            last_failed_at=50, last_failed_reason="Pod resize timed out",
        )  # fmt: skip
        reply = schedule(inp([group()], [pod("a", status=st)]))
        assert [(r.cpu, r.memory) for r in reply.resizes] == [(1, 4 * GI)]
        assert "revert" in reply.resizes[0].reason and "timed out" in reply.resizes[0].reason

    def test_type_without_ippr_spec_is_never_resized(self) -> None:
        """A status on a pod of a type with no spec is ignored."""
        reply = schedule(inp([group(ippr=None)], [pod("a")], 2))
        assert reply.resizes == () and len(reply.infeasible_demands) == 1

    def test_pod_without_raylet_absorbs_but_sends_nothing(self) -> None:
        """Ray counts a pending pod at its max but only sends resizes to pods with a raylet."""
        pending = replace(pod("p"), status=InstanceStatus.ALLOCATED, ray_node_id="")
        reply = schedule(inp([group()], [pending], 3))
        assert reply.resizes == () and reply.launches == {}
        assert any(d.action == "skip" and "no raylet" in d.reason for d in reply.reasons)

    def test_leaving_pod_is_not_resized(self) -> None:
        """An outdated pod is terminated, not grown; its replacement takes the demand."""
        t = group(launch_config_hash="new")
        reply = schedule(inp([t], [replace(pod("a"), launch_config_hash="old")], 2))
        assert reply.resizes == ()
        assert [x.instance_id for x in reply.terminations] == ["a"]
        assert reply.launches == {"w": 1}

    def test_request_resources_can_resize(self) -> None:
        """A request_resources constraint of CPU:3 is met by growing the pod."""
        from gcs.policy.autoscaling.scheduler import ClusterConstraint

        base = inp([group()], [pod("a")])
        reply = schedule(
            replace(base, constraints=(ClusterConstraint((ResourceDemand({"CPU": 3}),)),))
        )
        assert [r.cpu for r in reply.resizes] == [4] and reply.launches == {}
        assert "request_resources" in reply.resizes[0].reason
