"""The KubeRay provider against the strict fake API server: scaling by RayCluster patches,
request-id replays, resourceVersion conflicts, maxReplicas caps, workersToDelete, and a
misconfigured IPPR group under the running reconciler."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import structlog

from gcs.autoscaler.providers.base import LaunchNodeError, TerminateNodeError
from gcs.autoscaler.providers.kuberay.provider import CAPPED
from gcs.policy.autoscaling.model import NodeKind
from gcs.testing.fake_k8s import FakeKubernetes
from tests.autoscaler.kuberay_harness import IPPR_SMALL, KubeRayHarness, raycluster, worker_group


@pytest.fixture
async def h() -> AsyncIterator[KubeRayHarness]:
    h = KubeRayHarness(raycluster(worker_group(replicas=1, max_replicas=3)))
    await h.start()
    yield h
    h.stop()


def _group(h: KubeRayHarness) -> dict:
    return h.cr()["spec"]["workerGroupSpecs"][0]


async def test_lists_head_and_workers_and_skips_terminating_pods(h: KubeRayHarness) -> None:
    h.k8s.grace_deletes = True
    listed = await h.provider.get_non_terminated()
    (worker,) = h.workers()
    assert {c.node_kind for c in listed.values()} == {NodeKind.HEAD, NodeKind.WORKER}
    assert listed[worker].node_type == "small-group" and listed[worker].is_running
    await h.provider.terminate([worker], "t-1")
    assert worker not in await h.provider.get_non_terminated()  # deletionTimestamp set
    assert worker in h.k8s.pod_names()


async def test_launch_patches_replicas_and_replays_are_no_ops(h: KubeRayHarness) -> None:
    await h.provider.launch({"small-group": 1}, "req-1")
    await h.provider.launch({"small-group": 1}, "req-1")
    assert _group(h)["replicas"] == 2 and len(h.workers()) == 2
    patches = [r for r in h.k8s.requests if r[0] == "PATCH" and "rayclusters" in r[1]]
    assert patches == [("PATCH", patches[0][1], "application/json-patch+json")]


async def test_launch_capped_at_max_replicas_reports_the_rest(h: KubeRayHarness) -> None:
    await h.provider.launch({"small-group": 4}, "req-1")
    assert _group(h)["replicas"] == 3
    (err,) = h.provider.poll_errors()
    assert isinstance(err, LaunchNodeError) and (err.count, err.details) == (2, CAPPED)


async def test_conflicting_change_is_retried_on_a_fresh_read(h: KubeRayHarness) -> None:
    """A user edit between our read and our patch: the test op fails (422), we re-read."""
    real = h.api.get_cluster
    calls = 0

    async def racing_get() -> dict:
        nonlocal calls
        calls += 1
        cr = await real()
        if calls == 1:  # someone edits after our read
            h.k8s.edit_raycluster(h.name, lambda o: o["metadata"].setdefault("labels", {}))
        return cr

    h.api.get_cluster = racing_get  # type: ignore[method-assign]
    await h.provider.launch({"small-group": 1}, "req-1")
    assert calls == 2 and _group(h)["replicas"] == 2
    assert h.provider.poll_errors() == []


async def test_terminate_names_workers_to_delete_then_clears_them(h: KubeRayHarness) -> None:
    await h.provider.launch({"small-group": 1}, "req-1")
    first, second = h.workers()
    await h.provider.terminate([first], "t-1")
    assert _group(h)["replicas"] == 1
    assert h.workers() == [second]  # the operator deleted the named pod
    assert _group(h)["scaleStrategy"]["workersToDelete"] == [first]
    await h.provider.get_non_terminated()
    assert _group(h)["scaleStrategy"]["workersToDelete"] == [first]  # listing only reads
    await h.provider.upkeep()
    assert _group(h)["scaleStrategy"]["workersToDelete"] == []


async def test_scale_waits_while_a_deletion_is_unfinished(h: KubeRayHarness) -> None:
    h.k8s.grace_deletes = True
    (worker,) = h.workers()
    await h.provider.terminate([worker], "t-1")
    await h.provider.launch({"small-group": 1}, "req-2")
    (err,) = h.provider.poll_errors()
    assert isinstance(err, LaunchNodeError) and "still deleting" in err.details
    await h.provider.terminate(["x"], "t-3")
    (err,) = h.provider.poll_errors()
    assert isinstance(err, TerminateNodeError)


async def test_head_is_never_deleted(h: KubeRayHarness) -> None:
    head = next(p for p in h.k8s.pod_names() if p.endswith("-head"))
    await h.provider.terminate([head], "t-1")
    assert head in h.k8s.pod_names()


class TestStrictFake:
    """The fake rejects what the real API server rejects."""

    @pytest.fixture
    def api(self, h: KubeRayHarness):  # type: ignore[no-untyped-def]
        return h.api

    async def test_json_patch_sent_as_merge_patch_is_400(self, api) -> None:  # type: ignore[no-untyped-def]
        from gcs.autoscaler.providers.kuberay.k8s import KubeApiError

        ops = [{"op": "replace", "path": "/spec/suspend", "value": True}]
        with pytest.raises(KubeApiError) as err:  # the client's default content type
            await api._run(lambda: api._custom.patch_namespaced_custom_object(
                group="ray.io", version="v1", namespace="default", plural="rayclusters",
                name=api.cluster_name, body=ops,
            ))  # fmt: skip
        assert err.value.status == 400

    async def test_strategic_merge_on_a_custom_resource_is_415(self, h: KubeRayHarness) -> None:
        from gcs.testing.fake_k8s import ApiError

        with pytest.raises(ApiError) as err:
            h.k8s.handle(
                "PATCH", f"/apis/ray.io/v1/namespaces/default/rayclusters/{h.name}",
                "application/strategic-merge-patch+json", {"spec": {}},
            )  # fmt: skip
        assert err.value.code == 415

    async def test_stale_resource_version_is_409_and_unknown_fields_400(self, api) -> None:  # type: ignore[no-untyped-def]
        from gcs.autoscaler.providers.kuberay.k8s import KubeApiError

        with pytest.raises(KubeApiError) as err:
            await api.merge_patch_cluster({"metadata": {"resourceVersion": "1"}})
        assert err.value.status == 409 and err.value.conflict
        with pytest.raises(KubeApiError) as err:
            await api.merge_patch_cluster({"spec": {"replicaz": 1}})
        assert err.value.status == 400 and "unknown field" in err.value.message

    async def test_resize_may_change_only_cpu_and_memory(self, h: KubeRayHarness) -> None:
        from gcs.autoscaler.providers.kuberay.k8s import KubeApiError

        (pod,) = h.workers()
        with pytest.raises(KubeApiError) as err:
            await h.api.resize_pod(
                pod,
                [
                    {
                        "op": "add",
                        "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu",
                        "value": "1",
                    }
                ],
            )
        assert err.value.status == 422


async def test_misconfigured_group_is_left_alone_and_resumes_when_fixed() -> None:
    """No resize and no scale-out for it, one error line naming group and rule, the other
    group keeps scaling; once the RayCluster is fixed, resizes resume."""
    bad = worker_group(replicas=1, min_replicas=1)
    bad["rayStartParams"]["num-cpus"] = "1"
    other = worker_group("other-group", replicas=0, cpu="8", memory="8Gi")
    h = KubeRayHarness(raycluster(bad, other, ippr=IPPR_SMALL))
    try:
        with structlog.testing.capture_logs() as logs:
            await h.start()
            await h.rounds(2)
            (pod,) = h.workers()
            h.ray.demand = [{"CPU": 2}, {"CPU": 2}]
            await h.rounds(3)
        errors = [e for e in logs if e["event"] == "autoscaler.ippr_misconfigured"]
        assert len(errors) == 1 and errors[0]["group"] == "small-group"
        assert "rayStartParams must not set num-cpus" in errors[0]["error"]
        assert h.workers() == [pod] and h.pod_cpu(pod) == "1"  # not resized, not scaled
        assert len(h.workers("other-group")) == 1  # the other group scaled out
        h.ray.demand = [{"CPU": 2}]
        h.k8s.edit_raycluster(
            h.name, lambda o: o["spec"]["workerGroupSpecs"][0]["rayStartParams"].clear()
        )
        h.ray.nodes[h.workers("other-group")[0]].used["CPU"] = 8  # busy: no room there
        await h.rounds(2)
        assert h.pod_cpu(pod) == "4"
    finally:
        h.stop()


def test_kubeconfig_points_the_client_at_the_fake(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fake = FakeKubernetes()
    path = fake.write_kubeconfig(tmp_path / "kubeconfig", namespace="ns1")
    doc = json.loads(path.read_text())
    assert doc["clusters"][0]["cluster"]["server"] == fake.url
    fake.stop()


async def test_workers_to_delete_kept_until_the_pods_are_gone(h: KubeRayHarness) -> None:
    h.k8s.grace_deletes = True
    (worker,) = h.workers()
    await h.provider.terminate([worker], "t-1")
    await h.provider.get_non_terminated()
    await h.provider.upkeep()
    assert _group(h)["scaleStrategy"]["workersToDelete"] == [worker]
    h.k8s.finish_deletions()
    await h.provider.get_non_terminated()
    await h.provider.upkeep()
    assert _group(h)["scaleStrategy"]["workersToDelete"] == []


@pytest.mark.parametrize("policy", ["Suspend", "Delete"])
async def test_idle_cluster_is_terminated_once_no_driver_ran_for_the_timeout(policy: str) -> None:
    cr = raycluster(worker_group(replicas=1))
    cr["spec"]["idleTerminationOptions"] = {"timeoutSeconds": 30, "policy": policy}
    h = KubeRayHarness(cr)
    try:
        await h.start()
        h.ray.drivers = 1
        await h.round(advance_s=100)
        h.ray.drivers = 0
        await h.round(advance_s=1)  # the idle clock starts
        await h.round(advance_s=29)
        assert h.cr()["spec"].get("idleSuspend") is None and not h.provider.idle_terminated
        await h.round(advance_s=2)
        assert h.provider.idle_terminated
        if policy == "Suspend":
            assert h.cr()["spec"]["idleSuspend"] is True
            assert h.k8s.pod_names() == []  # the operator suspended it
        else:
            meta = h.cr()["metadata"]
            assert "ray.io/idle-termination-cleanup-finalizer" in meta["finalizers"]
            assert meta["deletionTimestamp"]
    finally:
        h.stop()


async def test_a_driver_resets_the_idle_clock() -> None:
    cr = raycluster(worker_group(replicas=1))
    cr["spec"]["idleTerminationOptions"] = {"timeoutSeconds": 30}
    h = KubeRayHarness(cr)
    try:
        await h.start()
        await h.round(advance_s=20)
        h.ray.drivers = 1
        await h.round(advance_s=1)
        h.ray.drivers = 0
        await h.round(advance_s=20)
        await h.round(advance_s=9)
        assert not h.provider.idle_terminated
    finally:
        h.stop()
