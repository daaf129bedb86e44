"""Virtual-cluster identifiers (ant-ray ``VirtualClusterID`` rules).

Ids are free-form strings. A job cluster id is ``<parent>##<job>``; ``"##"`` anywhere makes an id
a job-cluster id and the parent is the text before the first separator.
"""

from __future__ import annotations

PRIMARY_CLUSTER_ID = "kPrimaryClusterID"
JOB_SEPARATOR = "##"
UNDIVIDED = "NIL"
"""Bucket of a divisible cluster's nodes lent to no job cluster (never on the wire)."""


def is_job_cluster_id(cluster_id: str) -> bool:
    return JOB_SEPARATOR in cluster_id


def parent_id(cluster_id: str) -> str:
    """The parent of a job cluster id, or ``""`` for any other id."""
    if not is_job_cluster_id(cluster_id):
        return ""
    return cluster_id.split(JOB_SEPARATOR, 1)[0]


def job_name(cluster_id: str) -> str:
    return cluster_id.split(JOB_SEPARATOR, 1)[1] if is_job_cluster_id(cluster_id) else ""


def build_job_cluster_id(parent: str, job: str) -> str:
    return f"{parent}{JOB_SEPARATOR}{job}"
