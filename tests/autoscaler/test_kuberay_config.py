"""``ray.io/ippr`` validation (every rule of the seed), per-pod resize state (§5.4), and the
RayCluster -> config reading.  Pure functions over RayCluster / Pod dicts."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gcs.autoscaler.providers.kuberay.cluster import cluster_config
from gcs.autoscaler.providers.kuberay.ippr import (
    need_sync_with_raylet,
    parse_ippr,
    pod_status,
    resize_patch,
)
from gcs.policy.autoscaling.scheduler.types import IpprSpec
from tests.autoscaler.kuberay_harness import GI, IPPR_SMALL, raycluster, worker_group


def _cr(group: dict[str, Any] | None = None, entry: Any = None) -> dict[str, Any]:
    ippr = {"small-group": entry} if entry is not None else IPPR_SMALL
    return raycluster(group or worker_group(), ippr=ippr)


class TestValidation:
    def test_valid_group_reads_template_limits_as_min(self) -> None:
        g = worker_group(cpu="1500m", memory="2Gi")
        got = parse_ippr(_cr(g, {"max-cpu": 3, "max-memory": "4Gi", "resize-timeout": 30}))
        assert got.errors == {}
        spec = got.groups["small-group"].spec
        assert (spec.min_cpu, spec.min_memory) == (1.5, 2 * GI)
        assert (spec.max_cpu, spec.max_memory, spec.resize_timeout_s) == (3, 4 * GI, 30)
        assert got.groups["small-group"].downsize is False

    def test_absent_annotation_disables_ippr(self) -> None:
        assert parse_ippr(raycluster(worker_group())).groups == {}
        assert parse_ippr(None).groups == {}

    @pytest.mark.parametrize("missing", ["max-cpu", "max-memory", "resize-timeout"])
    def test_each_key_is_required(self, missing: str) -> None:
        entry = dict(IPPR_SMALL["small-group"])
        del entry[missing]
        got = parse_ippr(_cr(entry=entry))
        assert got.errors == {
            "small-group": f"ray.io/ippr group 'small-group': {missing} is required"
        }

    @pytest.mark.parametrize("param", ["num-cpus", "memory"])
    def test_ray_start_params_must_not_fix_cpu_or_memory(self, param: str) -> None:
        g = worker_group()
        g["rayStartParams"][param] = "2"
        err = parse_ippr(_cr(g)).errors["small-group"]
        assert "'small-group'" in err and f"rayStartParams must not set {param}" in err

    @pytest.mark.parametrize("res", ["cpu", "memory"])
    def test_cpu_and_memory_requests_are_required(self, res: str) -> None:
        g = worker_group()
        del g["template"]["spec"]["containers"][0]["resources"]["requests"][res]
        err = parse_ippr(_cr(g)).errors["small-group"]
        assert f"must set resources.requests.{res}" in err

    def test_resize_policy_must_not_restart(self) -> None:
        g = worker_group()
        g["template"]["spec"]["containers"][0]["resizePolicy"] = [
            {"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "RestartContainer"},
        ]
        err = parse_ippr(_cr(g)).errors["small-group"]
        assert "resizePolicy for memory must use restartPolicy NotRequired" in err

    @pytest.mark.parametrize(
        ("entry", "words"),
        [
            ({"max-cpu": "lots", "max-memory": "4Gi", "resize-timeout": 1}, "max-cpu"),
            ({"max-cpu": 4, "max-memory": "4Gi", "resize-timeout": 0}, "resize-timeout"),
            ({"max-cpu": 4, "max-memory": "4Gi", "resize-timeout": 1, "x": 1}, "unknown key x"),
            ({"max-cpu": 4, "max-memory": "4Gi", "resize-timeout": 1, "downsize": "y"}, "downsize"),
            ("4 cpus", "expected an object"),
        ],
    )
    def test_bad_values_name_the_key(self, entry: Any, words: str) -> None:
        assert words in parse_ippr(_cr(entry=entry)).errors["small-group"]

    def test_bad_group_leaves_the_others_alone(self) -> None:
        bad = worker_group("bad-group")
        bad["rayStartParams"]["num-cpus"] = "1"
        cr = raycluster(
            worker_group(), bad, ippr={**IPPR_SMALL, "bad-group": IPPR_SMALL["small-group"]}
        )
        got = parse_ippr(cr)
        assert set(got.groups) == {"small-group"} and set(got.errors) == {"bad-group"}

    def test_entries_for_unknown_groups_are_ignored(self) -> None:
        cr = raycluster(worker_group(), ippr={"nope": {"max-cpu": 1}})
        assert parse_ippr(cr).groups == {} and parse_ippr(cr).errors == {}

    def test_unparsable_annotation_is_an_error_for_every_worker_group(self) -> None:
        cr = raycluster(worker_group())
        cr["metadata"]["annotations"]["ray.io/ippr"] = "{not json"
        assert "not valid JSON" in parse_ippr(cr).errors["small-group"]


def _pod(
    *,
    spec: dict[str, Any] | None = None,
    actual: dict[str, Any] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    annotation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    base = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    return {
        "metadata": {
            "name": "p",
            "annotations": {"ray.io/ippr-status": json.dumps(annotation)} if annotation else {},
        },
        "spec": {"containers": [{"name": "ray", "resources": copy.deepcopy(spec or base)}]},
        "status": {
            "conditions": conditions or [],
            "containerStatuses": [{"name": "ray", "resources": copy.deepcopy(actual or base)}],
        },
    }


SPEC = IpprSpec(max_cpu=4, max_memory=8 * GI, min_cpu=2, min_memory=4 * GI, resize_timeout_s=10)


class TestPodStatus:
    def test_settled_pod(self) -> None:
        st = pod_status(_pod(), SPEC, 100)
        assert (st.current_cpu, st.current_memory) == (2, 4 * GI)
        assert st.k8s_resize_status is None and st.can_resize_up(SPEC)

    def test_deferred_cpu_suggests_what_the_node_has_and_queues_it(self) -> None:
        msg = "Node didn't have enough resource: cpu, requested: 4000, used: 6000, capacity: 9000"
        cond = [
            {"type": "PodResizePending", "status": "True", "reason": "Deferred", "message": msg}
        ]
        st = pod_status(_pod(conditions=cond), SPEC, 100)
        assert st.suggested_max_cpu == 4.0  # (9000-6000)/1000 + (limit 2 - request 1)
        assert st.k8s_resize_status == "new" and st.desired_cpu == 4.0

    def test_infeasible_memory_counts_other_containers(self) -> None:
        msg = f"Node didn't have enough capacity: memory, requested: {20 * GI}, capacity: {12 * GI}"
        cond = [
            {"type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": msg}
        ]
        pod = _pod(conditions=cond)
        pod["spec"]["containers"].append(
            {"name": "side", "resources": {"requests": {"memory": "1Gi"}}}
        )
        # capacity 12Gi + (limit 4Gi - request 2Gi) - the 1Gi sidecar
        assert pod_status(pod, SPEC, 100).suggested_max_memory == 13 * GI

    def test_unexpected_pending_message_suggests_nothing(self) -> None:
        cond = [
            {"type": "PodResizePending", "status": "True", "reason": "Deferred", "message": "?"}
        ]
        st = pod_status(_pod(conditions=cond), SPEC, 100)
        assert st.suggested_max_cpu is None and st.k8s_resize_status == "deferred"

    def test_error_is_recorded_once_and_reverted(self) -> None:
        cond = [
            {
                "type": "PodResizeInProgress",
                "status": "True",
                "reason": "Error",
                "message": "random error",
            }
        ]
        big = {"requests": {"cpu": "3", "memory": "6Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}
        st = pod_status(_pod(spec=big, conditions=cond, annotation={"resizing-at": 95}), SPEC, 100)
        assert (st.last_failed_at, st.last_failed_reason) == (100, "random error")
        assert (st.desired_cpu, st.desired_memory, st.k8s_resize_status) == (2, 4 * GI, "new")
        assert not st.can_resize_up(SPEC)

    def test_timeout_is_strictly_after_resize_timeout(self) -> None:
        big = {"requests": {"cpu": "3", "memory": "6Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}
        cond = [{"type": "PodResizeInProgress", "status": "True"}]
        pod = _pod(spec=big, conditions=cond, annotation={"resizing-at": 80})
        assert pod_status(pod, SPEC, 90).last_failed_at is None
        st = pod_status(pod, SPEC, 91)
        assert st.last_failed_reason == "Pod resize timed out" and st.desired_cpu == 2

    def test_completed_resize_needs_a_raylet_sync(self) -> None:
        st = pod_status(_pod(annotation={"resizing-at": 123, "raylet-id": "ab"}), SPEC, 10_000)
        assert need_sync_with_raylet(st) and st.last_failed_at is None

    def test_resize_patch_keeps_the_request_gap_below_limits(self) -> None:
        ops = {o["path"].rsplit("/", 2)[-2] + "/" + o["path"].rsplit("/", 1)[-1]: o["value"]
               for o in resize_patch(_pod(), 4, 8 * GI)}  # fmt: skip
        assert ops == {
            "limits/cpu": "4", "requests/cpu": "3",
            "limits/memory": str(8 * GI), "requests/memory": str(6 * GI),
        }  # fmt: skip

    def test_resize_patch_without_limits_sets_requests(self) -> None:
        only = {"requests": {"cpu": "1", "memory": "2Gi"}}
        ops = resize_patch(_pod(spec=only, actual=only), 4, 8 * GI)
        values = {o["path"]: o["value"] for o in ops}
        assert values["/spec/containers/0/resources/requests/cpu"] == "4"
        assert "/spec/containers/0/resources/limits/cpu" not in values


class TestClusterConfig:
    def test_groups_become_node_types(self) -> None:
        g = worker_group(replicas=1, min_replicas=1, max_replicas=5, cpu="1500m", numOfHosts=2)
        g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
        cr = raycluster(g, ippr=IPPR_SMALL)
        cr["spec"]["autoscalerOptions"]["upscalingMode"] = "Conservative"
        cfg = cluster_config(cr, parse_ippr(cr), {})
        t = cfg.scheduler.node_types["small-group"]
        assert dict(t.resources) == {"CPU": 2, "memory": GI, "GPU": 1}
        assert (t.min_workers, t.max_workers) == (2, 10)
        assert t.ippr is not None and t.ippr.min_cpu == 1.5
        assert cfg.upscaling_speed == 1 and cfg.scheduler.idle_timeout_s == 60
        assert dict(cfg.scheduler.node_types["headgroup"].resources) == {"CPU": 0, "memory": 4 * GI}

    def test_misconfigured_group_is_frozen_at_what_runs(self) -> None:
        g = worker_group(replicas=2, min_replicas=3, max_replicas=5)
        g["rayStartParams"]["memory"] = "1000"
        cr = raycluster(g, ippr=IPPR_SMALL)
        t = cluster_config(cr, parse_ippr(cr), {"small-group": 2}).scheduler.node_types[
            "small-group"
        ]
        assert (t.min_workers, t.max_workers, t.ippr) == (2, 2, None)


class TestMoreRayScenarios:
    """The rest of Ray's test_ippr_provider.py cases that are pure."""

    @pytest.mark.parametrize(
        ("message", "reason", "attr", "want"),
        [
            # used 4Gi of 10Gi, gap limit 4Gi - request 2Gi: 6Gi + 2Gi
            (f"Node didn't have enough resource: memory, requested: {9 * GI}, used: {4 * GI}, "
             f"capacity: {10 * GI}", "Deferred", "suggested_max_memory", 8 * GI),
            # capacity 9000m + gap 1
            ("Node didn't have enough capacity: cpu, requested: 12000, capacity: 9000",
             "Infeasible", "suggested_max_cpu", 10.0),
        ],
    )  # fmt: skip
    def test_pending_suggestions(self, message: str, reason: str, attr: str, want: float) -> None:
        cond = [
            {"type": "PodResizePending", "status": "True", "reason": reason, "message": message}
        ]
        st = pod_status(_pod(conditions=cond), SPEC, 100)
        assert getattr(st, attr) == want and st.k8s_resize_status == "new"

    def test_existing_failure_blocks_resizing_up_and_sends_nothing(self) -> None:
        ann = {"last-failed-at": 50, "last-failed-reason": "Pod resize timed out"}
        st = pod_status(_pod(annotation=ann), SPEC, 100)
        assert not st.can_resize_up(SPEC) and not st.has_resize_to_send()
        assert st.last_failed_reason == "Pod resize timed out"
