"""Ray id sizes and validation (28-byte node ids, nil = all 0xFF)."""

from __future__ import annotations

from gcs.base.errors import InvalidArgument

NODE_ID_SIZE = 28
CLUSTER_ID_SIZE = 28
JOB_ID_SIZE = 4
PLACEMENT_GROUP_ID_SIZE = 18
NIL_NODE_ID = b"\xff" * NODE_ID_SIZE
NIL_JOB_ID = b"\xff" * JOB_ID_SIZE
"""``JobID::Nil()``: on an error, one for every driver rather than one job's."""


def require_node_id(value: bytes, field: str = "node_id") -> bytes:
    """Return ``value`` if it is a well-formed, non-nil 28-byte node id, else InvalidArgument."""
    if not value:
        raise InvalidArgument(f"{field} is required")
    if len(value) != NODE_ID_SIZE:
        raise InvalidArgument(
            f"{field} must be {NODE_ID_SIZE} bytes, got {len(value)} ({value.hex()[:64]})"
        )
    if value == NIL_NODE_ID:
        raise InvalidArgument(f"{field} is the nil id")
    return value
