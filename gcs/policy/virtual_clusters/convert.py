"""Conversions between model values and the wire/storage protos."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gcs.policy.virtual_clusters.errors import VcError
from gcs.policy.virtual_clusters.model import Cluster, Kind, NodeInstance, counted_members, floor
from gcs.proto import (
    autoscaler_pb2,
    gcs_pb2,
    gcs_service_pb2,
    virtual_cluster_data_pb2,
    virtual_cluster_pb2,
)

NodeLookup = Callable[[str], NodeInstance | None]
ResourceLookup = Callable[[str], tuple[Mapping[str, float], Mapping[str, float]]]
"""node id -> (total, available) from the GCS resource view."""


def to_table_data(
    cluster: Cluster, node: NodeLookup, *, is_removed: bool = False
) -> virtual_cluster_data_pb2.VirtualClusterTableData:
    """What is persisted (table VIRTUAL_CLUSTER, key = id) and published: a full snapshot.

    The dead flag is not serialised (ant-ray); replay derives it from the node table.
    """
    data = virtual_cluster_data_pb2.VirtualClusterTableData(
        id=cluster.id,
        divisible=cluster.divisible,
        is_removed=is_removed,
        revision=cluster.revision,
        max_nodes=cluster.max_nodes,
    )
    for node_id in sorted(cluster.members):
        instance = node(node_id)
        entry = data.node_instances[node_id]
        if instance is not None:
            entry.hostname = instance.hostname
            entry.template_id = instance.template_id
    data.min_replica_sets.update(cluster.min_replica_sets)
    data.max_replica_sets.update(cluster.max_replica_sets)
    data.declared_replica_sets.update(cluster.declared)
    return data


def node_instances_proto(
    cluster: Cluster, node: NodeLookup
) -> dict[str, virtual_cluster_data_pb2.NodeInstance]:
    """``CreateOrUpdateVirtualClusterReply.node_instances``: every node, lent ones included."""
    out = {}
    for node_id in sorted(cluster.members):
        instance = node(node_id)
        out[node_id] = virtual_cluster_data_pb2.NodeInstance(
            hostname=instance.hostname if instance else "",
            template_id=instance.template_id if instance else "",
        )
    return out


def to_view(
    cluster: Cluster, node: NodeLookup, resources: ResourceLookup
) -> virtual_cluster_pb2.VirtualClusterView:
    """``GetAllVirtualClusterInfo`` entry: alive nodes only, with resources attached."""
    view = virtual_cluster_pb2.VirtualClusterView(
        id=cluster.id, divisible=cluster.divisible, revision=cluster.revision
    )
    for node_id in counted_members(cluster, node):
        instance = node(node_id)
        assert instance is not None
        total, available = resources(node_id)
        entry = view.node_instance_views[node_id]
        entry.hostname = instance.hostname
        entry.template_id = instance.template_id
        entry.resources_total.update(total)
        entry.resources_available.update(available)
    return view


def node_view_from_gcs_node_info(info: gcs_pb2.GcsNodeInfo) -> NodeInstance:
    """A node-table row as the model sees it (hex id; template = ``node_type_name``)."""
    return NodeInstance(
        node_id=info.node_id.hex(),
        template_id=info.node_type_name,
        hostname=info.node_manager_hostname,
        is_dead=info.state != gcs_pb2.GcsNodeInfo.ALIVE,
    )


def status_proto(error: VcError | None = None) -> gcs_service_pb2.GcsStatus:
    if error is None:
        return gcs_service_pb2.GcsStatus(code=0)
    return gcs_service_pb2.GcsStatus(code=int(error.code), message=error.message)


def autoscaler_state(cluster: Cluster, node: NodeLookup) -> autoscaler_pb2.VirtualClusterState:
    """One ``ClusterResourceState.virtual_cluster_states`` entry (reference §11), without the
    pending demand, which the autoscaler-state manager fills in.

    ``nodes``: undivided nodes of a divisible cluster (the primary included), all nodes of an
    indivisible one; dead nodes are left out (the autoscaler can neither use nor release them).
    ``min_replica_sets`` is the cluster's :func:`~gcs.policy.virtual_clusters.model.floor`: the
    configured min where the config names a template, else the declared count, so an
    autoscaler (ours or ant-ray's, which keep ``min_replica_sets``) never releases the
    reservation a tenant declared.
    """
    state = autoscaler_pb2.VirtualClusterState(
        parent_virtual_cluster_id=cluster.parent_id if cluster.kind is Kind.JOB else "",
        divisible=cluster.divisible,
        revision=cluster.revision,
        nodes=counted_members(cluster, node, undivided_only=cluster.divisible),
        max_nodes=cluster.max_nodes,
    )
    state.min_replica_sets.update(floor(cluster))
    state.max_replica_sets.update(cluster.max_replica_sets)
    return state
