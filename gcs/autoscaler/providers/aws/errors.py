"""AWS error codes -> what the autoscaler does with them.

Capacity and quota refusals hold the node type back and send demand to other types
(:class:`~gcs.policy.autoscaling.model.LaunchErrorKind`; the codes are those Karpenter
treats as unfulfillable); a capacity refusal in one subnet first moves on to the next
subnet; throttling is retried with backoff; an unknown instance is already gone.
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

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


def code_of(err: BaseException) -> str:
    if isinstance(err, ClientError):
        return str(err.response.get("Error", {}).get("Code", ""))
    return ""


def describe(err: BaseException) -> str:
    """One line: the code and AWS's message."""
    if isinstance(err, ClientError):
        info = err.response.get("Error", {})
        return f"{info.get('Code', 'error')}: {info.get('Message', '')}".strip()
    if isinstance(err, BotoCoreError):
        return f"{type(err).__name__}: {err}"
    return str(err) or type(err).__name__


def launch_kind(err: BaseException) -> LaunchErrorKind:
    code = code_of(err)
    if code in CAPACITY_CODES:
        return LaunchErrorKind.CAPACITY
    if code in QUOTA_CODES:
        return LaunchErrorKind.QUOTA
    return LaunchErrorKind.ERROR


def is_gone(err: BaseException) -> bool:
    return code_of(err) in _GONE_CODES
