"""What the autoscaler asks of a GCS: the interfaces and the values they return.

:class:`AutoscalerGcs` is what the reconciler and its subscribers call; :class:`ProviderGcs`
what a provider may call (the read-only provider lists the GCS's nodes, KubeRay resizes
raylets and counts drivers); :class:`RuntimeGcs` all of it plus InternalKV.
:class:`~gcs.autoscaler.grpc_gcs.GrpcAutoscalerGcs` implements them over gRPC;
``gcs.testing.cloud`` and the simulator have fakes.  Implementations raise
:class:`~gcs.base.errors.Unavailable` when the GCS cannot answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gcs.proto import autoscaler_pb2

__all__ = [
    "AutoscalerGcs",
    "ClusterStateSource",
    "DrainResult",
    "ProviderGcs",
    "RuntimeGcs",
    "VcSnapshot",
    "VcUpdate",
]


@dataclass(frozen=True, slots=True)
class DrainResult:
    accepted: bool
    rejection_reason: str = ""


@dataclass(frozen=True, slots=True)
class VcSnapshot:
    """A virtual cluster as CreateOrUpdate needs it: revision and replica sets (dead
    members included, as the GCS counts them)."""

    revision: int
    divisible: bool
    replica_sets: Mapping[str, int]
    nodes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class VcUpdate:
    ok: bool
    #: The revision was stale (someone changed the cluster since it was read).
    expired: bool = False
    message: str = ""
    #: Members after a successful update.
    nodes: frozenset[str] = field(default_factory=frozenset)


class ClusterStateSource(Protocol):
    async def get_cluster_resource_state(self) -> autoscaler_pb2.ClusterResourceState: ...


class AutoscalerGcs(ClusterStateSource, Protocol):
    async def report_autoscaling_state(self, state: autoscaler_pb2.AutoscalingState) -> None: ...

    async def drain_idle(self, node_id_hex: str, message: str) -> DrainResult:
        """DrainNode(IDLE_TERMINATION, deadline 0): a busy raylet rejects it."""
        ...

    async def stop_node(self, node_id_hex: str) -> bool:
        """Ray's ``drain_nodes``: stop the node now (legacy NodeInfo DrainNode)."""
        ...

    async def release_nodes(self, cluster_id: str, node_ids_hex: list[str]) -> None:
        """Give a virtual cluster's nodes back to the primary cluster (never below its
        floor, and only while the cluster is as last read)."""
        ...

    async def read_virtual_cluster(self, cluster_id: str) -> VcSnapshot | None:
        """The cluster now, or None if it does not exist."""
        ...

    async def update_virtual_cluster(
        self, cluster_id: str, *, divisible: bool, replica_sets: Mapping[str, int], revision: int
    ) -> VcUpdate:
        """CreateOrUpdateVirtualCluster with ``revision``, as an autoscaler move (the
        tenant's declared replica sets are kept); a stale revision is ``expired``."""
        ...


class ProviderGcs(ClusterStateSource, Protocol):
    async def resize_raylet(
        self, node_id_hex: str, resources: Mapping[str, float]
    ) -> Mapping[str, float]:
        """``ResizeRayletResourceInstances``: the raylet's totals after the resize."""
        ...

    async def live_drivers(self) -> int:
        """Drivers alive now (Ray-internal ones not counted)."""
        ...


class RuntimeGcs(AutoscalerGcs, ProviderGcs, Protocol):
    """Everything the autoscaler runtime uses, InternalKV included (a standalone
    autoscaler keeps its instances there; both publish their event log there)."""

    async def get(self, namespace: bytes, key: bytes) -> bytes | None: ...

    async def put(self, namespace: bytes, key: bytes, value: bytes) -> None: ...
