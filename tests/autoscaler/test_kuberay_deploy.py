"""deploy/kuberay: the example RayCluster is valid for the strict fake and for IPPR, and the
RBAC grants exactly the verbs the provider uses (each one exercised here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gcs.autoscaler.providers.kuberay.cluster import cluster_config
from gcs.autoscaler.providers.kuberay.ippr import parse_ippr
from gcs.testing.fake_k8s import ResizeOutcome
from tests.autoscaler.kuberay_harness import KubeRayHarness

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kuberay"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _granted() -> set[tuple[str, str]]:
    (role,) = [d for d in _docs("rbac.yaml") if d["kind"] == "Role"]
    return {
        (res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]
    }


def _used(requests: list[tuple[str, str, str]]) -> set[tuple[str, str]]:
    out = set()
    for method, path, _ in requests:
        parts = path.strip("/").split("/")
        if "rayclusters" in parts:
            res, verb = "rayclusters", {"GET": "get", "PATCH": "patch", "DELETE": "delete"}[method]
        elif parts[-1] == "pods":
            res, verb = "pods", "list"
        elif parts[-1] == "resize":
            res, verb = "pods/resize", "patch"
        else:
            res, verb = "pods", {"GET": "get", "PATCH": "patch"}[method]
        out.add((res, verb))
    return out


def test_example_raycluster_reads_with_ippr_and_no_errors() -> None:
    (cr,) = _docs("raycluster.yaml")
    ippr = parse_ippr(cr)
    assert ippr.errors == {} and ippr.groups["small-group"].downsize
    cfg = cluster_config(cr, ippr, {})
    assert cfg.scheduler.node_types["small-group"].ippr is not None
    for doc in _docs("gcs.yaml") + _docs("rbac.yaml"):
        assert doc["kind"] in {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}


async def test_rbac_is_exactly_what_the_provider_uses() -> None:
    (cr,) = _docs("raycluster.yaml")
    cr["spec"]["idleTerminationOptions"] = {"timeoutSeconds": 5, "policy": "Delete"}
    h = KubeRayHarness(cr)  # the strict fake accepts the example as is
    try:
        await h.start()
        await h.rounds(2)
        (pod,) = h.workers()
        h.k8s.script_resize(pod, ResizeOutcome("inprogress"))
        h.ray.demand = [{"CPU": 2}]
        await h.rounds(3)  # resize (pods/resize, annotation), scale-out (raycluster patch)
        h.ray.demand = []
        await h.provider.terminate([h.workers()[-1]], "t-1")
        await h.rounds(2, advance_s=10)  # no driver: idle termination, policy Delete
        assert h.provider.idle_terminated
        assert _used(h.k8s.requests) == _granted()
    finally:
        h.stop()
