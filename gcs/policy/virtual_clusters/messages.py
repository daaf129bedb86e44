"""ant-ray's exact status messages (facts clients display), plus our few additions."""

from __future__ import annotations

ID_EMPTY = "Invalid request, the virtual cluster id is empty."
PRIMARY_CREATE = "Invalid request, kPrimaryClusterID can not be created or updated."
PRIMARY_REMOVE = "Invalid request, kPrimaryClusterID can not be removed."
PRIMARY_REMOVE_NODES = "Invalid request, kPrimaryClusterID should not be updated via this API."
PRIMARY_AUTOSCALING = (
    "Invalid request, kPrimaryClusterID's autoscaling config can not be updated by this API."
)
NO_ENOUGH_TO_REMOVE = (
    "No enough nodes to remove from the virtual cluster. The replica sets that gcs can remove "
    "at most are shown below. Use it as a suggestion to adjust your request or cluster."
)
NO_ENOUGH_TO_ADD = (
    "No enough nodes to add to the virtual cluster. The replica sets that gcs can add at most "
    "are shown below. Use it as a suggestion to adjust your request or cluster."
)
REMOVE_NODES_FAILED = (
    "Failed to remove some of the nodes because they are not idle nor found in the virtual "
    "cluster. These nodes with failure are shown below."
)
AUTOSCALER_FILLS_INDIVISIBLE = (  # ours, after NO_ENOUGH_TO_ADD
    "The autoscaler could launch them, but it fills indivisible clusters only: create this "
    "one indivisible, or with the nodes that are free."
)
MAX_NODES_TOO_SMALL = "Invalid request, max_nodes is too small."
AUTOSCALING_MISSING = "Invalid request, the virtual cluster id does not exist."
JOB_ID_EMPTY = "Invalid request, the job id is empty."  # ours: ant-ray does not check


def replicas_negative(replicas: int, cluster_id: str) -> str:
    return f"Invalid request, replicas({replicas}) must >= 0, virtual_cluster_id: {cluster_id}"


def template_empty(cluster_id: str) -> str:
    return f"Invalid request, template_id is empty, virtual_cluster_id: {cluster_id}"


def id_has_separator(cluster_id: str) -> str:
    """Ours (ant-ray accepts such ids, quirk Q4)."""
    return (
        "Invalid request, the virtual cluster id can not contain '##', "
        f"virtual_cluster_id: {cluster_id}"
    )


def invalid_id(problem: str) -> str:
    """Ours: a new cluster's id breaks the id rule (``ids.ID_RULE``)."""
    return f"Invalid request, {problem}."


def revision_expired(requested: int, cluster_id: str, current: int) -> str:
    return (
        f"The revision ({requested}) is expired, the latest revision of the virtual cluster "
        f"{cluster_id} is {current}"
    )


def incompatible(cluster_id: str, expected: bool, actual: bool) -> str:
    return (
        f"The requested attributes are incompatible with virtual cluster {cluster_id}. "
        f"expect: ({int(expected)}), actual: ({int(actual)})."
    )


def vc_not_exists(cluster_id: str) -> str:
    return f"virtual cluster not exists: {cluster_id}"


def not_exclusive(cluster_id: str) -> str:
    return f" virtual cluster is not exclusive: {cluster_id}"


def job_cluster_exists(job_cluster_id: str) -> str:
    return f"The job cluster {job_cluster_id} already exists."


def no_enough_for_job(job_cluster_id: str) -> str:
    return f"No enough node instances to create the job cluster {job_cluster_id}"


def remove_parent_missing(cluster_id: str) -> str:
    return (
        "Failed to remove virtual cluster, parent cluster not exists, "
        f"virtual cluster id: {cluster_id}"
    )


def remove_parent_indivisible(cluster_id: str) -> str:
    return (
        "Failed to remove virtual cluster, parent cluster is not divisible, "
        f"virtual cluster id: {cluster_id}"
    )


def remove_job_in_use(cluster_id: str) -> str:
    return (
        f"Failed to remove virtual cluster, job cluster is in use, virtual cluster id: {cluster_id}"
    )


def job_cluster_missing(cluster_id: str) -> str:
    return f"The job cluster {cluster_id} does not exist."


def logical_missing(cluster_id: str) -> str:
    return f"The logical cluster {cluster_id} does not exist."


def still_in_use(cluster_id: str) -> str:
    return f"The virtual cluster {cluster_id} can not be removed as it is still in use. "


def min_max_mismatch(group: str) -> str:
    return f"Invalid request, {group}'s max and min configs do not match."


def vc_does_not_exist(cluster_id: str) -> str:
    return f"Virtual cluster {cluster_id} does not exist."


def invalid_job_cluster(cluster_id: str) -> str:
    return f"Invalid virtual cluster, virtual cluster id: {cluster_id}"


def below_floor(cluster_id: str, short: dict[str, int]) -> str:
    """Ours: an autoscaler move that would take a cluster below its floor."""
    floors = ", ".join(f"{template}: {count}" for template, count in sorted(short.items()))
    return (
        f"The autoscaler can not take virtual cluster {cluster_id} below its floor ({floors}): "
        "the replica sets the tenant declared, or min_replica_sets where the autoscaling "
        "config names the template."
    )


def unknown_node_types(unknown: list[str], known: list[str]) -> str:
    """Ours, put before ant-ray's "No enough nodes to add..." (which stays, with its code and
    recommendation, for ant-ray's clients)."""
    names = ", ".join(unknown)
    kinds = "Unknown node type" if len(unknown) == 1 else "Unknown node types"
    listed = ", ".join(known) if known else "none yet"
    return (
        f"{kinds} {names}: no node of it has joined and no autoscaler can launch one "
        f"(known node types: {listed})."
    )
