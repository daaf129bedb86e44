"""The KubeRay provider under the real reconciler, against the fake Kubernetes API server.

:class:`SimRay` stands in for the GCS: a Ray node per pod (created when the fake operator
creates the pod), pending demand set by the test, ``ResizeRayletResourceInstances`` applied
with Ray's clamping.  Time is a :class:`FakeClock`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from gcs.autoscaler.instances import InstanceManager
from gcs.autoscaler.instances.storage import MemoryInstanceStorage
from gcs.autoscaler.providers.kuberay.k8s import KubernetesApi
from gcs.autoscaler.providers.kuberay.provider import KubeRayProvider, initial_config
from gcs.autoscaler.reconciler import (
    CloudInstanceUpdater,
    EventLog,
    RayStopper,
    Reconciler,
)
from gcs.base.clock import FakeClock
from gcs.proto import autoscaler_pb2
from gcs.testing.cloud import FakeAutoscalerGcs
from gcs.testing.fake_k8s import FakeKubernetes

GI = 2**30
HEAD = "node:__internal_head__"


def worker_group(
    name: str = "small-group",
    *,
    replicas: int = 1,
    min_replicas: int = 0,
    max_replicas: int = 10,
    cpu: str = "1",
    memory: str = "1Gi",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "groupName": name,
        "replicas": replicas,
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "rayStartParams": {},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": "rayproject/ray:2.60.0",
                        "resources": {
                            "requests": {"cpu": cpu, "memory": memory},
                            "limits": {"cpu": cpu, "memory": memory},
                        },
                    }
                ]
            }
        },
        **extra,
    }


def raycluster(
    *groups: dict[str, Any],
    ippr: Mapping[str, Any] | None = None,
    name: str = "raycluster-ippr",
    idle_timeout_s: int = 60,
) -> dict[str, Any]:
    annotations = {}
    if ippr is not None:
        annotations["ray.io/ippr"] = json.dumps({"groups": ippr})
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {"version": "v2", "idleTimeoutSeconds": idle_timeout_s},
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "ray-head",
                                "image": "rayproject/ray:2.60.0",
                                "resources": {"requests": {"cpu": "1", "memory": "4Gi"}},
                            }
                        ]
                    }
                },
            },
            "workerGroupSpecs": list(groups),
        },
    }


IPPR_SMALL = {"small-group": {"max-cpu": "4", "max-memory": "4Gi", "resize-timeout": 60}}


@dataclass
class SimNode:
    node_id: str
    pod: str
    group: str
    total: dict[str, float]
    used: dict[str, float] = field(default_factory=dict)

    def available(self) -> dict[str, float]:
        return {k: v - self.used.get(k, 0.0) for k, v in self.total.items()}


class SimRay(FakeAutoscalerGcs):
    """Ray nodes on the fake's pods, pending demand, and raylet resizes."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, SimNode] = {}
        self.demand: list[dict[str, float]] = []
        self.resize_calls: list[tuple[str, dict[str, float]]] = []
        self.fail_resize = False
        self.drivers = 0
        self._ids = 0

    def add_pod(self, pod: Mapping[str, Any]) -> None:
        labels = pod["metadata"]["labels"]
        self._ids += 1
        node_id = f"{self._ids:056x}"
        container = pod["spec"]["containers"][0]["resources"]
        size = container.get("limits") or container.get("requests") or {}
        if labels["ray.io/node-type"] == "head":
            total = {"CPU": 0.0, HEAD: 1.0}
        else:
            from gcs.autoscaler.config import quantity

            total = {
                "CPU": quantity(size["cpu"], "cpu"),
                "memory": float(int(quantity(size["memory"], "memory"))),
            }
        self.nodes[pod["metadata"]["name"]] = SimNode(
            node_id, pod["metadata"]["name"], labels["ray.io/group"], total
        )

    def remove_pod(self, pod: Mapping[str, Any]) -> None:
        self.nodes.pop(pod["metadata"]["name"], None)

    def node_of(self, pod: str) -> SimNode:
        return self.nodes[pod]

    async def get_cluster_resource_state(self) -> autoscaler_pb2.ClusterResourceState:
        s = autoscaler_pb2.ClusterResourceState()
        for n in self.nodes.values():
            s.node_states.add(
                node_id=bytes.fromhex(n.node_id),
                instance_id=n.pod,
                ray_node_type_name=n.group,
                status=autoscaler_pb2.RUNNING if n.used else autoscaler_pb2.IDLE,
                total_resources=n.total,
                available_resources=n.available(),
            )
        for shape in self.demand:
            s.pending_resource_requests.add(count=1).request.resources_bundle.update(shape)
        return s

    async def resize_raylet(
        self, node_id_hex: str, resources: Mapping[str, float]
    ) -> dict[str, float]:
        self.resize_calls.append((node_id_hex, dict(resources)))
        if self.fail_resize:
            raise RuntimeError("GCS unavailable")
        node = next(n for n in self.nodes.values() if n.node_id == node_id_hex)
        for name, target in resources.items():
            free = node.total[name] - node.used.get(name, 0.0)
            node.total[name] += max(target - node.total[name], -free)
        return dict(node.total)

    async def live_drivers(self) -> int:
        return self.drivers

    def place(self, pod: str, shape: Mapping[str, float]) -> None:
        """Run ``shape`` on ``pod`` (a pending request that now fits there)."""
        node = self.nodes[pod]
        for k, v in shape.items():
            node.used[k] = node.used.get(k, 0.0) + v
        assert all(v >= 0 for v in node.available().values()), node
        self.demand.remove(dict(shape))


class KubeRayHarness:
    def __init__(self, cr: Mapping[str, Any]) -> None:
        self.clock = FakeClock(1_800_000_000.0)
        self.k8s = FakeKubernetes().start()
        self.ray = SimRay()
        self.k8s.on_pod_created = self.ray.add_pod
        self.k8s.on_pod_deleted = self.ray.remove_pod
        self.k8s.add_raycluster(cr)
        self.name = cr["metadata"]["name"]
        cfg = client.Configuration()
        cfg.host = self.k8s.url
        self.api = KubernetesApi(client.ApiClient(cfg), "default", self.name)
        self.provider = KubeRayProvider(self.api, self.ray, self.clock)
        self.events = EventLog(self.clock)
        self.updater = CloudInstanceUpdater(self.provider, self.clock, self.events)
        self.stopper = RayStopper(self.ray, self.events)
        self.im = InstanceManager(
            MemoryInstanceStorage(), self.clock, subscribers=[self.updater, self.stopper]
        )
        self.reconciler: Reconciler | None = None

    async def start(self) -> None:
        cluster = await initial_config(self.api)
        self.reconciler = Reconciler(
            instances=self.im,
            provider=self.provider,
            gcs=self.ray,
            cluster=cluster,
            clock=self.clock,
            events=self.events,
            updater=self.updater,
            stopper=self.stopper,
            schedule_in_thread=False,
        )

    async def round(self, advance_s: float = 1.0) -> None:
        assert self.reconciler is not None
        self.clock.advance(advance_s)
        await self.reconciler.reconcile_once()
        await self.updater.settle()
        await self.stopper.settle()

    async def rounds(self, n: int, advance_s: float = 1.0) -> None:
        for _ in range(n):
            await self.round(advance_s)

    def stop(self) -> None:
        self.k8s.stop()

    # -- views ------------------------------------------------------------------------------
    def workers(self, group: str = "small-group") -> list[str]:
        return self.k8s.pod_names(group)

    def ippr_status(self, pod: str) -> dict[str, Any]:
        raw = self.k8s.pod(pod)["metadata"]["annotations"].get("ray.io/ippr-status")
        return json.loads(raw) if raw else {}

    def pod_cpu(self, pod: str) -> str:
        """The running container's CPU limit (what the kubelet applied)."""
        return str(
            self.k8s.pod(pod)["status"]["containerStatuses"][0]["resources"]["limits"]["cpu"]
        )

    def cr(self) -> dict[str, Any]:
        return copy.deepcopy(self.k8s.raycluster(self.name))
