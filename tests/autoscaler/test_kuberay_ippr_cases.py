"""The seed's four IPPR cases, downsizing and the timeout sequence, end to end through the
real reconciler and scheduler, the KubeRay provider on the real ``kubernetes`` client and
the fake API server; Ray nodes simulated (:mod:`tests.autoscaler.kuberay_harness`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

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
