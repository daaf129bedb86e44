"""The virtual head node ``gcs serve --head`` shows to real Ray 2.60 processes.

``ray start --address=<gcs>`` (Python ``Node(head=False)``) asks the GCS for the head node
(``GetAllNodeInfo`` with the ``is_head_node`` selector) and refuses to start without one: it
needs the head's ``temp_dir`` (the default for its own) and ``session_dir``.  A Ray head is a
raylet started by ``ray start --head``, which also starts Ray's own GCS, so it cannot be
pointed at ours.

Choice: a *virtual* head, not a real head raylet.  The record answers the head lookup and
nothing else: it is not in the node table, so no health check, load poll, syncer peer,
autoscaler node state or ``ray.nodes()`` entry refers to a raylet that does not exist, and
drivers never pick it (they connect to a raylet found on their own host).  The head carries
no resources; work runs on the worker raylets.  What a real head raylet would add (work
pinned to ``node:__internal_head__``, e.g. Ray's job supervisor and dashboard) is run by
starting an ordinary worker on the GCS machine.  A raylet that registers with
``is_head_node`` (our agent with ``--head``) takes precedence over the virtual record.

``gcs serve --head --head-raylet`` starts such a raylet itself (``ray start --address
--block`` on the GCS host, ``gcs.server.head_processes``): Ray 2.60's job API runs every job
driver on the head node.  ``ray start`` cannot ask to be the head of an existing GCS, so
that raylet carries :data:`HEAD_RAYLET_LABEL` and the GCS registers it with
``is_head_node`` (:func:`promote_head_raylet`).
"""

from __future__ import annotations

import hashlib
import os

from gcs.proto import gcs_pb2

HEAD_NODE_LABEL = "ray.io/node-id"
HEAD_RAYLET_LABEL = "gcs.ray.io/head-raylet"
"""``ray start --labels`` key (value ``true``) of the raylet ``--head-raylet`` starts."""


def promote_head_raylet(node: gcs_pb2.GcsNodeInfo) -> bool:
    """Mark a registering raylet carrying :data:`HEAD_RAYLET_LABEL` as the head node;
    True when it does."""
    if node.labels.get(HEAD_RAYLET_LABEL) != "true":
        return False
    node.is_head_node = True
    return True


def virtual_head_id(cluster_id: bytes) -> bytes:
    """A 28-byte node id, stable for one cluster (the same after a GCS restart)."""
    return hashlib.sha224(b"gcs-virtual-head:" + cluster_id).digest()


def virtual_head(
    cluster_id: bytes,
    *,
    address: str,
    temp_dir: str,
    session_name: str,
    start_time_ms: int,
) -> gcs_pb2.GcsNodeInfo:
    """The head record: ALIVE, ``is_head_node``, the directories Ray's workers read."""
    node_id = virtual_head_id(cluster_id)
    return gcs_pb2.GcsNodeInfo(
        node_id=node_id,
        node_manager_address=address,
        node_manager_hostname=address,
        node_name=address,
        state=gcs_pb2.GcsNodeInfo.ALIVE,
        is_head_node=True,
        start_time_ms=start_time_ms,
        temp_dir=temp_dir,
        session_dir=os.path.join(temp_dir, session_name),
        labels={HEAD_NODE_LABEL: node_id.hex()},
    )
