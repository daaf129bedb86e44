"""Read-only questions other GCS parts ask (GetVirtualClusters, views, node filters)."""

from __future__ import annotations

from gcs.policy.virtual_clusters.ids import PRIMARY_CLUSTER_ID
from gcs.policy.virtual_clusters.model import Cluster, Draft, Kind


def get_virtual_clusters(
    draft: Draft, cluster_id: str, include_job_clusters: bool, only_indivisible: bool
) -> list[Cluster]:
    """ant-ray's visitor: "" = every logical cluster then the primary; a job or unknown id
    gives nothing; the primary itself is never emitted."""
    if cluster_id == "":
        visit = [*draft.logical(), draft.primary()]
    else:
        found = draft.get(cluster_id)
        visit = [found] if found is not None and found.kind is not Kind.JOB else []
    out: list[Cluster] = []
    for cluster in visit:
        if include_job_clusters and cluster.divisible:
            out.extend(draft.jobs_of(cluster.id))
        if only_indivisible and cluster.divisible:
            continue
        if cluster.kind is Kind.PRIMARY:
            continue
        out.append(cluster)
    return out


def all_for_view(draft: Draft, limit: int | None) -> tuple[list[Cluster], int]:
    """GetAllVirtualClusterInfo order: per logical cluster its job clusters then itself; then
    the primary's job clusters, then the primary. ``limit`` <= 0 or None = no limit."""
    visit: list[Cluster] = []
    for cluster in [*draft.logical(), draft.primary()]:
        if cluster.divisible:
            visit.extend(draft.jobs_of(cluster.id))
        visit.append(cluster)
    total = len(visit)
    if limit is not None and limit > 0:
        visit = visit[:limit]
    return visit, total


def nodes_in(draft: Draft, cluster_id: str | None) -> frozenset[str] | None:
    """GetAllNodeInfo / resources filter: ``None`` = no filter; unknown id = no node.

    Dead nodes still listed in the cluster match (ant-ray)."""
    if not cluster_id:
        return None
    cluster = draft.get(cluster_id)
    return frozenset(cluster.members) if cluster is not None else frozenset()


def is_node_schedulable(draft: Draft, cluster_id: str, node_id: str) -> bool:
    """GCS scheduling predicate: no id, the primary or an unknown cluster allow every node."""
    if not cluster_id or cluster_id == PRIMARY_CLUSTER_ID:
        return True
    cluster = draft.get(cluster_id)
    return cluster is None or node_id in cluster.members
