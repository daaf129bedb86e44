"""Conversions between the raylet's plain values and Ray's protobuf messages."""

from __future__ import annotations

from collections.abc import Mapping

from gcs.base.labels import selector_proto
from gcs.proto import common_pb2, gcs_pb2
from gcs.raylet.resources import Demand, LabelConstraint

SYNTHETIC_SECONDS_KEY = "gcs-synthetic-seconds"
"""Request metadata: the raylet itself frees the lease this many seconds after granting."""

SYNTHETIC_DETACH_KEY = "gcs-synthetic-detach"
"""Request metadata ``"1"``: reply at once; the lease stays queued/held in the raylet."""

NODE_ID_LABEL = "ray.io/node-id"


def selector_from_proto(selector: common_pb2.LabelSelector) -> tuple[LabelConstraint, ...]:
    return tuple(
        (c.label_key, int(c.operator), tuple(c.label_values)) for c in selector.label_constraints
    )


def selector_to_proto(selector: tuple[LabelConstraint, ...]) -> common_pb2.LabelSelector:
    return common_pb2.LabelSelector(
        label_constraints=[
            common_pb2.LabelSelectorConstraint(
                label_key=k,
                operator=op,  # type: ignore[arg-type]  # enum values are ints
                label_values=list(v),
            )
            for k, op, v in selector
        ]
    )


def parse_selector(selector: Mapping[str, str]) -> tuple[LabelConstraint, ...]:
    """Ray's string form (``{"zone": "in(a,b)"}``, ``"!a"``...) as Ray's client sends it."""
    proto = selector_proto(selector)
    return tuple((c.label_key, c.operator, tuple(c.label_values)) for c in proto.label_constraints)


def demand_to_proto(row: Demand) -> gcs_pb2.ResourceDemand:
    """One row; a request without a selector still reports ONE empty LabelSelector (Ray)."""
    return gcs_pb2.ResourceDemand(
        shape=row.shape,
        num_ready_requests_queued=row.ready,
        num_infeasible_requests_queued=row.infeasible,
        backlog_size=row.backlog_size,
        label_selectors=[selector_to_proto(row.selector)],
        job_id=row.job_id,
    )


def metadata_value(metadata: object, key: str) -> str | None:
    for item in metadata or ():  # type: ignore[attr-defined]
        k, v = item
        if k == key:
            return v.decode() if isinstance(v, bytes) else str(v)
    return None
