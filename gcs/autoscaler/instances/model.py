"""Instances the autoscaler manages, the updates that move them, and their encoding.

Values only: frozen dataclasses, no I/O.  An :class:`Instance` carries its whole status
history; :func:`apply_update` is the one place that turns an update into the next value
(and the one place that enforces the field rules of each status, Ray 2.60 §2.3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from gcs.autoscaler.instances.transitions import UPSERT_STATUSES, is_valid_transition
from gcs.base.errors import InvalidArgument
from gcs.policy.autoscaling.model import InstanceStatus, NodeKind

__all__ = [
    "Instance",
    "InstanceUpdate",
    "InvalidInstanceUpdate",
    "StatusHistory",
    "apply_update",
    "decode_instance",
    "encode_instance",
]


class InvalidInstanceUpdate(InvalidArgument):
    """An update the lifecycle does not allow; nothing of its batch was applied."""


@dataclass(frozen=True, slots=True)
class StatusHistory:
    status: InstanceStatus
    time_ns: int
    details: str = ""


@dataclass(frozen=True, slots=True)
class TerminationCause:
    """Why the scheduler asked to stop an instance (carried into RAY_STOP_REQUESTED)."""

    cause: str  # "IDLE", "MAX_NUM_NODES", "MAX_NUM_NODE_PER_TYPE", "OUTDATED", ...
    idle_duration_ms: int = 0
    details: str = ""


@dataclass(frozen=True, slots=True)
class Instance:
    instance_id: str
    status: InstanceStatus
    instance_type: str = ""
    node_kind: NodeKind = NodeKind.WORKER
    cloud_instance_id: str = ""
    node_id: str = ""
    """The Ray node id (hex) once a raylet runs on it."""
    launch_request_id: str = ""
    termination: TerminationCause | None = None
    history: tuple[StatusHistory, ...] = ()

    def entered_at_ns(self, status: InstanceStatus | None = None) -> int | None:
        """When it last entered ``status`` (default: the current one)."""
        want = self.status if status is None else status
        for entry in reversed(self.history):
            if entry.status == want:
                return entry.time_ns
        return None

    def times_entered(self, status: InstanceStatus) -> int:
        return sum(1 for entry in self.history if entry.status == status)

    def latest_details(self) -> str:
        return self.history[-1].details if self.history else ""


@dataclass(frozen=True, slots=True)
class InstanceUpdate:
    """One requested change (Ray's ``InstanceUpdateEvent``)."""

    instance_id: str
    new_status: InstanceStatus
    details: str = ""
    upsert: bool = False
    instance_type: str = ""
    launch_request_id: str = ""
    cloud_instance_id: str = ""
    node_kind: NodeKind | None = None
    ray_node_id: str = ""
    termination: TerminationCause | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False)


def apply_update(current: Instance | None, update: InstanceUpdate, time_ns: int) -> Instance:
    """The instance after ``update``; raises :class:`InvalidInstanceUpdate`."""
    new = update.new_status
    iid = update.instance_id
    if current is None:
        if not update.upsert:
            raise InvalidInstanceUpdate(f"instance {iid} does not exist (and upsert is false)")
        if new not in UPSERT_STATUSES:
            raise InvalidInstanceUpdate(
                f"instance {iid} cannot be created in status {new.name}; "
                f"only {sorted(s.name for s in UPSERT_STATUSES)}"
            )
        base = Instance(instance_id=iid, status=InstanceStatus.UNKNOWN)
    else:
        if not is_valid_transition(current.status, new):
            raise InvalidInstanceUpdate(
                f"instance {iid}: transition {current.status.name} -> {new.name} is not allowed"
            )
        base = current
    changes: dict[str, object] = {"status": new}
    if new == InstanceStatus.QUEUED and current is None:
        changes["instance_type"] = _required(update.instance_type, "instance_type", iid, new)
    elif new == InstanceStatus.REQUESTED:
        changes["launch_request_id"] = _required(
            update.launch_request_id, "launch_request_id", iid, new
        )
        changes["instance_type"] = _required(update.instance_type, "instance_type", iid, new)
    elif new == InstanceStatus.ALLOCATED:
        changes["cloud_instance_id"] = _required(
            update.cloud_instance_id, "cloud_instance_id", iid, new
        )
        if update.node_kind is None:
            raise InvalidInstanceUpdate(f"instance {iid}: ALLOCATED requires node_kind")
        changes["node_kind"] = update.node_kind
        changes["instance_type"] = _required(update.instance_type, "instance_type", iid, new)
        changes["node_id"] = update.ray_node_id
    elif new == InstanceStatus.RAY_RUNNING:
        changes["node_id"] = _required(update.ray_node_id, "ray_node_id", iid, new)
    elif new == InstanceStatus.TERMINATING:
        cloud = update.cloud_instance_id or base.cloud_instance_id
        changes["cloud_instance_id"] = _required(cloud, "cloud_instance_id", iid, new)
    elif new == InstanceStatus.RAY_STOP_REQUESTED:
        changes["termination"] = update.termination
    if update.ray_node_id and new in (InstanceStatus.RAY_STOPPED, InstanceStatus.RAY_STOPPING):
        changes["node_id"] = update.ray_node_id
    changes["history"] = (*base.history, StatusHistory(new, time_ns, update.details))
    return replace(base, **changes)  # type: ignore[arg-type]


def _required(value: str, name: str, iid: str, status: InstanceStatus) -> str:
    if not value:
        raise InvalidInstanceUpdate(f"instance {iid}: {status.name} requires {name}")
    return value


# -- encoding (JSON: small, readable with redis-cli / sqlite3, versioned) -----------------
_FORMAT = 1


def encode_instance(inst: Instance) -> bytes:
    doc = {
        "v": _FORMAT,
        "id": inst.instance_id,
        "status": inst.status.name,
        "type": inst.instance_type,
        "kind": inst.node_kind.value,
        "cloud": inst.cloud_instance_id,
        "node": inst.node_id,
        "launch": inst.launch_request_id,
        "history": [[h.status.name, h.time_ns, h.details] for h in inst.history],
    }
    if inst.termination is not None:
        t = inst.termination
        doc["termination"] = [t.cause, t.idle_duration_ms, t.details]
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_instance(raw: bytes) -> Instance:
    doc = json.loads(raw)
    if doc.get("v") != _FORMAT:
        raise ValueError(f"unknown instance record format {doc.get('v')!r}")
    term = doc.get("termination")
    return Instance(
        instance_id=doc["id"],
        status=InstanceStatus[doc["status"]],
        instance_type=doc["type"],
        node_kind=NodeKind(doc["kind"]),
        cloud_instance_id=doc["cloud"],
        node_id=doc["node"],
        launch_request_id=doc["launch"],
        termination=TerminationCause(term[0], int(term[1]), term[2]) if term else None,
        history=tuple(StatusHistory(InstanceStatus[s], int(t), d) for s, t, d in doc["history"]),
    )
