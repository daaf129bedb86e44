"""Virtual-cluster identifiers (ant-ray ``VirtualClusterID`` rules).

A job cluster id is ``<parent>##<job>``; ``"##"`` anywhere makes an id a job-cluster id and
the parent is the text before the first separator.

ant-ray's GCS checks only that an id is not empty and not ``kPrimaryClusterID`` (its CLI and
dashboard check nothing more), yet its tools break on other ids: the dashboard addresses a
cluster as ``DELETE /virtual_clusters/<id>`` (a ``/`` never matches), ``"##"`` turns an id
into a job cluster's, and ``ray vcluster remove bad id`` is two arguments.  So a new logical
cluster's id follows :data:`ID_RULE` (ids created before keep working).
"""

from __future__ import annotations

import re

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


ID_RULE = (
    "use letters, digits, '-', '_' and '.', starting with a letter or digit "
    "('/' breaks ant-ray's dashboard URLs, '##' marks job clusters, spaces break the CLI)"
)
_VALID_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def id_problem(cluster_id: str) -> str | None:
    """Why ``cluster_id`` cannot name a new virtual cluster, or None when it can."""
    if not cluster_id:
        return "the virtual cluster id is empty"
    if cluster_id == PRIMARY_CLUSTER_ID:
        return f"{PRIMARY_CLUSTER_ID} is the primary cluster's id"
    if _VALID_ID.fullmatch(cluster_id) is None:
        return f"virtual cluster id {cluster_id!r} is invalid: {ID_RULE}"
    return None
