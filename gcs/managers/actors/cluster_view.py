"""The live :class:`~gcs.managers.actors.scheduler.ClusterView`: node manager, resource cache,
placement groups and virtual clusters, read at the moment the scheduler chooses."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gcs.managers.actors.placement import Candidate
from gcs.managers.resources import ResourceCache
from gcs.proto import gcs_pb2
from gcs.rpc.raylet_io.gateway import raylet_address

__all__ = ["LiveClusterView"]

PG = gcs_pb2.PlacementGroupTableData
NodeFilter = Callable[[str], frozenset[bytes] | None]
"""virtual cluster id -> its node ids (None: no filter)."""


def _no_filter(cluster_id: str) -> frozenset[bytes] | None:
    return None


def _no_cluster(job_id: bytes) -> str:
    return ""


class LiveClusterView:
    def __init__(
        self,
        alive: Mapping[bytes, gcs_pb2.GcsNodeInfo],
        cache: ResourceCache,
        placement_groups: Mapping[bytes, gcs_pb2.PlacementGroupTableData],
        *,
        job_cluster: Callable[[bytes], str] = _no_cluster,
        cluster_nodes: NodeFilter = _no_filter,
    ) -> None:
        self._alive = alive
        self._cache = cache
        self._pgs = placement_groups
        self._job_cluster = job_cluster
        self._cluster_nodes = cluster_nodes

    def candidates(self) -> list[Candidate]:
        bundles: dict[bytes, set[tuple[bytes, int]]] = {}
        for pg in self._pgs.values():
            if pg.state == PG.REMOVED:
                continue
            for i, bundle in enumerate(pg.bundles):
                if bundle.node_id:
                    bundles.setdefault(bundle.node_id, set()).add((pg.placement_group_id, i))
        out = []
        for node_id, node in self._alive.items():
            entry = self._cache.nodes.get(node_id)
            total = dict(node.resources_total)
            available = total
            draining = node.state_snapshot.state == gcs_pb2.NodeSnapshot.DRAINING
            if entry is not None:
                total = dict(entry.data.resources_total) or total
                available = dict(entry.data.resources_available)
                draining = draining or entry.data.draining_deadline_timestamp_ms > 0
            out.append(
                Candidate(
                    node_id,
                    total,
                    available,
                    draining,
                    frozenset(bundles.get(node_id, ())),
                    labels=node.labels,
                )
            )
        return out

    def raylet_address(self, node_id: bytes) -> str | None:
        node = self._alive.get(node_id)
        return raylet_address(node) if node is not None else None

    def allowed_nodes(self, job_id: bytes) -> frozenset[bytes] | None:
        cluster = self._job_cluster(job_id)
        return self._cluster_nodes(cluster) if cluster else None
