"""The seed's four IPPR cases, downsizing and the timeout sequence, end to end through the
real reconciler and scheduler, the KubeRay provider on the real ``kubernetes`` client and
the fake API server; Ray nodes simulated (:mod:`tests.autoscaler.kuberay_harness`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gcs.testing.fake_k8s import ApiError, ResizeOutcome
from tests.autoscaler.kuberay_harness import (
    GI,
    IPPR_SMALL,
    KubeRayHarness,
    raycluster,
    worker_group,
)


@pytest.fixture
async def h1() -> AsyncIterator[KubeRayHarness]:
    """One small-group worker (1 CPU / 1Gi, IPPR up to 4 / 4Gi)."""
    h = KubeRayHarness(raycluster(worker_group(replicas=1, min_replicas=1), ippr=IPPR_SMALL))
    await h.start()
    await h.rounds(2)
    yield h
    h.stop()


async def test_case1_idle_worker_is_resized_in_place(h1: KubeRayHarness) -> None:
    """T1 [{CPU 1}] + pending {CPU 2} -> the worker grows to 4 CPUs; no new pod."""
    (pod,) = h1.workers()
    h1.ray.demand = [{"CPU": 2}]
    await h1.round()
    assert h1.pod_cpu(pod) == "4"  # resized through pods/resize, the kubelet applied it
    assert h1.ippr_status(pod)["resizing-at"] is not None
    assert h1.ray.node_of(pod).total["CPU"] == 1  # Ray not told before the pod grew
    await h1.round()
    assert h1.ray.node_of(pod).total == {"CPU": 4, "memory": 4 * GI}
    assert h1.ippr_status(pod) == {
        "raylet-id": h1.ray.node_of(pod).node_id,
        "resizing-at": None,
        "suggested-max-cpu": None,
        "suggested-max-memory": None,
        "last-failed-at": None,
        "last-failed-reason": None,
    }
    h1.ray.place(pod, {"CPU": 2})
    await h1.rounds(2)
    assert h1.workers() == [pod]
    resize_paths = [r for r in h1.k8s.requests if r[1].endswith("/resize")]
    assert resize_paths == [("PATCH", f"/api/v1/namespaces/default/pods/{pod}/resize",
                             "application/json-patch+json")]  # fmt: skip


async def test_case2_resize_and_scale_out_then_resize_the_new_worker(h1: KubeRayHarness) -> None:
    """[{CPU 1}] + {CPU 2}, {CPU 4} -> resize to 4 and launch one; the new one then grows."""
    (first,) = h1.workers()
    h1.ray.demand = [{"CPU": 2}, {"CPU": 4}]
    await h1.round()
    assert h1.pod_cpu(first) == "4"
    assert h1.cr()["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    (second,) = [p for p in h1.workers() if p != first]
    await h1.round()  # synced: the first worker has 4 CPUs in Ray
    h1.ray.place(first, {"CPU": 4})
    await h1.rounds(2)  # the new worker runs Ray; {CPU 2} resizes it in place
    assert h1.pod_cpu(second) == "4"
    await h1.round()
    assert h1.ray.node_of(second).total["CPU"] == 4
    h1.ray.place(second, {"CPU": 2})
    await h1.rounds(2)
    assert h1.workers() == sorted([first, second])


async def test_case3_scale_out_from_zero_then_resize() -> None:
    """No worker: a pod is launched (counted at its IPPR max), then resized in place."""
    h = KubeRayHarness(raycluster(worker_group(replicas=0), ippr=IPPR_SMALL))
    try:
        await h.start()
        await h.rounds(2)
        assert h.workers() == []
        h.ray.demand = [{"CPU": 2}]
        await h.round()
        (pod,) = h.workers()  # one launch, not two: the new pod counts at CPU 4
        assert h.cr()["spec"]["workerGroupSpecs"][0]["replicas"] == 1
        await h.rounds(2)
        assert h.pod_cpu(pod) == "4"
        await h.round()
        assert h.ray.node_of(pod).total["CPU"] == 4
        h.ray.place(pod, {"CPU": 2})
        await h.rounds(2)
        assert h.workers() == [pod]
    finally:
        h.stop()


async def test_case4_timeout_rolls_back_scales_out_and_the_new_pod_grows(
    h1: KubeRayHarness,
) -> None:
    """T1 resize hangs; T2 no earlier than resize-timeout: rolled back + scale-out, the
    annotation says why; T3-T4 the new pod grows; the failed pod is not retried."""
    (first,) = h1.workers()
    h1.k8s.script_resize(first, ResizeOutcome("inprogress"))
    h1.ray.demand = [{"CPU": 2}]
    await h1.round()
    sent_at = h1.ippr_status(first)["resizing-at"]
    assert sent_at is not None
    assert h1.k8s.pod(first)["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "4"
    assert h1.pod_cpu(first) == "1"  # the kubelet has not applied it
    # up to the timeout: waiting, no scale-out, no rollback
    await h1.round(advance_s=30)
    await h1.round(advance_s=29)
    assert h1.clock.now_s() - sent_at <= 60
    assert len(h1.workers()) == 1
    assert h1.ippr_status(first)["last-failed-at"] is None
    await h1.round(advance_s=2)  # past resize-timeout
    status = h1.ippr_status(first)
    assert status["last-failed-reason"] == "Pod resize timed out"
    assert status["last-failed-at"] is not None
    assert h1.k8s.pod(first)["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1"
    assert len(h1.workers()) == 2  # scaled out in the same round
    (second,) = [p for p in h1.workers() if p != first]
    await h1.round()
    assert h1.ray.node_of(first).total["CPU"] == 1  # rollback synced to Ray
    await h1.rounds(2)
    assert h1.pod_cpu(second) == "4"
    await h1.round()
    assert h1.ray.node_of(second).total["CPU"] == 4
    h1.ray.place(second, {"CPU": 2})
    h1.ray.demand = [{"CPU": 2}]  # more demand: the failed pod is still not retried
    await h1.rounds(2)
    assert h1.pod_cpu(first) == "1"
    resizes_of_first = [r for r in h1.k8s.requests if r[1].endswith(f"{first}/resize")]
    assert len(resizes_of_first) == 2  # the resize and its rollback, nothing since


async def test_resize_error_rolls_back_with_the_kubelet_message(h1: KubeRayHarness) -> None:
    (pod,) = h1.workers()
    h1.k8s.script_resize(pod, ResizeOutcome("error", "container runtime refused"))
    h1.ray.demand = [{"CPU": 2}]
    await h1.round()
    await h1.round()
    status = h1.ippr_status(pod)
    assert status["last-failed-reason"] == "container runtime refused"
    assert h1.pod_cpu(pod) == "1"
    assert len(h1.workers()) == 2


async def test_downsizing_gives_unused_capacity_back_after_the_idle_timeout() -> None:
    """Beyond Ray: logical resources shrink first (never below in use), then the pod;
    never below the template size."""
    ippr = {"small-group": {**IPPR_SMALL["small-group"], "downsize": True}}
    h = KubeRayHarness(
        raycluster(worker_group(replicas=1, min_replicas=1), ippr=ippr, idle_timeout_s=60)
    )
    try:
        await h.start()
        await h.rounds(2)
        (pod,) = h.workers()
        h.ray.demand = [{"CPU": 2}]
        await h.rounds(2)
        assert h.ray.node_of(pod).total["CPU"] == 4
        h.ray.place(pod, {"CPU": 2})
        await h.round(advance_s=30)
        await h.round(advance_s=29)
        assert h.pod_cpu(pod) == "4"  # unused for less than the idle timeout
        await h.round(advance_s=2)
        # shrunk to what is in use (2 CPU; memory back to the template's 1Gi)
        assert h.ray.node_of(pod).total == {"CPU": 2, "memory": GI}
        assert h.pod_cpu(pod) == "2"
        await h.round()
        assert h.ippr_status(pod)["resizing-at"] is None
        h.ray.node_of(pod).used.clear()  # the work ends
        await h.round(advance_s=1)
        await h.round(advance_s=61)
        assert h.pod_cpu(pod) == "1"  # template size, never below
        await h.round()
        assert h.ray.node_of(pod).total == {"CPU": 1, "memory": GI}
        await h.rounds(2, advance_s=61)
        assert h.pod_cpu(pod) == "1"
    finally:
        h.stop()


async def test_downsizing_pod_failure_restores_the_logical_resources() -> None:
    ippr = {"small-group": {**IPPR_SMALL["small-group"], "downsize": True}}
    h = KubeRayHarness(raycluster(worker_group(replicas=1, min_replicas=1), ippr=ippr))
    try:
        await h.start()
        await h.rounds(2)
        (pod,) = h.workers()
        h.ray.demand = [{"CPU": 2}]
        await h.rounds(2)
        h.ray.place(pod, {"CPU": 2})
        h.ray.node_of(pod).used.clear()
        h.k8s.fail_next[f"PATCH {pod}/resize"] = ApiError(500, "InternalError", "etcd down")
        await h.round(advance_s=1)
        await h.round(advance_s=61)
        calls = [c[1] for c in h.ray.resize_calls]
        assert calls[-2]["CPU"] == 1 and calls[-1]["CPU"] == 4  # shrunk, then restored
        assert h.ray.node_of(pod).total["CPU"] == 4
        assert h.pod_cpu(pod) == "4"
    finally:
        h.stop()


async def test_downsizing_is_off_unless_asked(h1: KubeRayHarness) -> None:
    (pod,) = h1.workers()
    h1.ray.demand = [{"CPU": 2}]
    await h1.rounds(2)
    h1.ray.place(pod, {"CPU": 2})
    h1.ray.node_of(pod).used.clear()
    await h1.rounds(3, advance_s=61)
    assert h1.pod_cpu(pod) == "4"


async def test_deferred_resize_is_retried_at_what_the_node_can_give(h1: KubeRayHarness) -> None:
    """PodResizePending/Deferred: the message's free capacity becomes the suggested max and
    the resize is re-sent at that size (Ray §3.2)."""
    (pod,) = h1.workers()
    msg = "Node didn't have enough resource: cpu, requested: 4000, used: 6000, capacity: 8000"
    h1.k8s.script_resize(pod, ResizeOutcome("deferred", msg))
    h1.ray.demand = [{"CPU": 2}]
    await h1.round()
    cond = h1.k8s.pod(pod)["status"]["conditions"][-1]
    assert (cond["type"], cond["reason"]) == ("PodResizePending", "Deferred")
    await h1.round()  # (8000 - 6000) / 1000 + (limit - request = 0) -> 2 CPUs
    assert h1.pod_cpu(pod) == "2"
    assert h1.ippr_status(pod)["suggested-max-cpu"] == 2.0
    await h1.round()
    assert h1.ray.node_of(pod).total["CPU"] == 2
    assert len(h1.workers()) == 1


async def test_raylet_sync_failure_keeps_the_resize_in_flight(h1: KubeRayHarness) -> None:
    """GCS down when the pod has grown: the annotation is not cleared; the next round syncs."""
    (pod,) = h1.workers()
    h1.ray.demand = [{"CPU": 2}]
    await h1.round()
    h1.ray.fail_resize = True
    await h1.round()
    assert h1.ippr_status(pod)["resizing-at"] is not None
    assert h1.ray.node_of(pod).total["CPU"] == 1
    h1.ray.fail_resize = False
    await h1.round()
    assert h1.ippr_status(pod)["resizing-at"] is None
    assert h1.ray.node_of(pod).total["CPU"] == 4


async def test_downsize_with_the_gcs_down_leaves_the_pod_alone() -> None:
    ippr = {"small-group": {**IPPR_SMALL["small-group"], "downsize": True}}
    h = KubeRayHarness(raycluster(worker_group(replicas=1, min_replicas=1), ippr=ippr))
    try:
        await h.start()
        await h.rounds(2)
        (pod,) = h.workers()
        h.ray.demand = [{"CPU": 2}]
        await h.rounds(2)
        h.ray.place(pod, {"CPU": 2})
        h.ray.node_of(pod).used.clear()
        h.ray.fail_resize = True
        await h.round(advance_s=1)
        await h.round(advance_s=61)
        assert h.pod_cpu(pod) == "4"  # no pod patch without the raylet shrinking first
        resizes = [r for r in h.k8s.requests if r[1].endswith(f"{pod}/resize")]
        assert len(resizes) == 1
    finally:
        h.stop()


async def test_mixed_cpu_up_memory_down_shrinks_memory_through_the_gcs_first(
    h1: KubeRayHarness,
) -> None:
    """Ray's mixed case: the GCS is asked for {CPU: current, memory: smaller} before the pod
    is patched with CPU up and memory down."""
    from gcs.policy.autoscaling.scheduler.types import Resize

    (pod,) = h1.workers()
    node = h1.ray.node_of(pod)
    await h1.provider.resize(
        [Resize("i", pod, node.node_id, "small-group", 2.0, GI / 2, 1.0, GI, "test")], []
    )
    assert h1.ray.resize_calls[-1] == (node.node_id, {"CPU": 1.0, "memory": GI / 2})
    requests = h1.k8s.pod(pod)["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": "2", "memory": str(GI // 2)}


async def test_removing_the_annotation_turns_ippr_off_and_forgets_statuses(
    h1: KubeRayHarness,
) -> None:
    assert h1.provider.ippr_statuses()
    h1.k8s.edit_raycluster(h1.name, lambda o: o["metadata"]["annotations"].pop("ray.io/ippr"))
    await h1.round()
    assert h1.provider.ippr_statuses() == {}
    assert h1.provider.current_config().scheduler.node_types["small-group"].ippr is None  # type: ignore[union-attr]
