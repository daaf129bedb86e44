"""The cluster's instances as EC2 describes them (every page), by the tags the provider
puts on what it launches.

Tags (Ray's names, :mod:`ray.autoscaler.tags`): ``ray-cluster-name``, ``ray-node-type``
(head / worker), ``ray-user-node-type`` (the node type), ``ray-launch-request`` (the launch
request id), ``Name``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gcs.autoscaler.providers.aws.session import Ec2

__all__ = [
    "TAG_CLUSTER",
    "TAG_KIND",
    "TAG_NODE_TYPE",
    "TAG_REQUEST",
    "Ec2Instance",
    "describe_cluster",
]

TAG_CLUSTER = "ray-cluster-name"
TAG_KIND = "ray-node-type"
TAG_NODE_TYPE = "ray-user-node-type"
TAG_REQUEST = "ray-launch-request"

LIVE = ("pending", "running")
ALL_STATES = ("pending", "running", "shutting-down", "terminated", "stopping", "stopped")


@dataclass(frozen=True, slots=True)
class Ec2Instance:
    instance_id: str
    state: str
    node_type: str
    kind: str
    request_id: str
    spot: bool
    state_reason: str = ""
    """``StateReason.Code`` (why it stopped or terminated)."""
    state_message: str = ""
    instance_type: str = ""
    subnet: str = ""
    zone: str = ""


def _instance(raw: Mapping[str, Any]) -> Ec2Instance:
    tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
    reason = raw.get("StateReason") or {}
    return Ec2Instance(
        instance_id=raw["InstanceId"],
        state=raw.get("State", {}).get("Name", ""),
        node_type=tags.get(TAG_NODE_TYPE, ""),
        kind=tags.get(TAG_KIND, "worker"),
        request_id=tags.get(TAG_REQUEST, ""),
        spot=raw.get("InstanceLifecycle") == "spot",
        state_reason=str(reason.get("Code", "")),
        state_message=str(reason.get("Message", "")),
        instance_type=str(raw.get("InstanceType", "")),
        subnet=str(raw.get("SubnetId", "")),
        zone=str((raw.get("Placement") or {}).get("AvailabilityZone", "")),
    )


async def describe_cluster(
    ec2: Ec2,
    cluster: str,
    *,
    states: tuple[str, ...] = LIVE,
    tags: Mapping[str, str] | None = None,
) -> list[Ec2Instance]:
    """The cluster's instances in ``states`` (and with ``tags``), over every page."""
    filters = [
        {"Name": "instance-state-name", "Values": list(states)},
        {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
        *({"Name": f"tag:{k}", "Values": [v]} for k, v in (tags or {}).items()),
    ]
    reservations = await ec2.pages("describe_instances", "Reservations", Filters=filters)
    return [_instance(i) for r in reservations for i in r.get("Instances", [])]
