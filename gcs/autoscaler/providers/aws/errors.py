"""AWS error codes -> what the autoscaler does with them.

Capacity and quota refusals hold the node type back and send demand to other types
(:class:`~gcs.policy.autoscaling.model.LaunchErrorKind`; the codes are those Karpenter
treats as unfulfillable); a capacity refusal in one subnet first moves on to the next
subnet; throttling is retried with backoff; an unknown instance is already gone.
"""

from __future__ import annotations

from typing import Any

from gcs.policy.autoscaling.model import LaunchErrorKind

__all__ = [
    "CAPACITY_CODES",
    "QUOTA_CODES",
    "THROTTLE_CODES",
    "code_of",
    "describe",
    "is_gone",
    "launch_kind",
]

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity", "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity", "InsufficientCapacity", "Unsupported",
        "UnfulfillableCapacity", "SpotMaxPriceTooLow", "InsufficientFreeAddressesInSubnet",
        "ReservationCapacityExceeded",
    }
)  # fmt: skip
"""The cloud cannot place this type here now; another subnet, or later, may."""
QUOTA_CODES = frozenset(
    {"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"}
)
"""An account limit refused it (no other subnet helps)."""
THROTTLE_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
_GONE_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})

SPOT_INTERRUPTED = frozenset({"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"})
"""``StateReason.Code`` of an instance AWS took back (spot interruption)."""


def _error(err: BaseException) -> dict[str, Any] | None:
    """botocore's ``ClientError.response["Error"]`` (read by shape: botocore is imported
    only where a client is built, so a missing boto3 is one clear config error)."""
    response = getattr(err, "response", None)
    if isinstance(response, dict) and isinstance(response.get("Error"), dict):
        return response["Error"]
    return None


def code_of(err: BaseException) -> str:
    info = _error(err)
    return str(info.get("Code", "")) if info is not None else ""


def describe(err: BaseException) -> str:
    """One line: the code and AWS's message."""
    info = _error(err)
    if info is not None:
        return f"{info.get('Code', 'error')}: {info.get('Message', '')}".strip()
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def launch_kind(err: BaseException) -> LaunchErrorKind:
    code = code_of(err)
    if code in CAPACITY_CODES:
        return LaunchErrorKind.CAPACITY
    if code in QUOTA_CODES:
        return LaunchErrorKind.QUOTA
    return LaunchErrorKind.ERROR


def is_gone(err: BaseException) -> bool:
    return code_of(err) in _GONE_CODES
