"""Request validation helpers shared by servicers: each error names the offending field."""

from __future__ import annotations

import math
from collections.abc import Mapping

from gcs.rpc.errors import InvalidArgument

MAX_NAME_BYTES = 1024


def resource_map(values: Mapping[str, float], field: str, *, max_entries: int) -> dict[str, float]:
    """Non-negative, finite amounts with non-empty names; at most ``max_entries`` of them."""
    if len(values) > max_entries:
        raise InvalidArgument(f"{field} has {len(values)} entries; the limit is {max_entries}")
    out: dict[str, float] = {}
    for name, amount in values.items():
        if not name:
            raise InvalidArgument(f"{field} has an empty resource name")
        if len(name) > MAX_NAME_BYTES:
            raise InvalidArgument(f"{field}[{name[:32]}...] name is too long")
        if math.isnan(amount) or math.isinf(amount):
            raise InvalidArgument(f"{field}[{name}] must be finite, got {amount}")
        if amount < 0:
            raise InvalidArgument(f"{field}[{name}] must be >= 0, got {amount}")
        out[name] = amount
    return out


def label_map(values: Mapping[str, str], field: str, *, max_entries: int) -> dict[str, str]:
    if len(values) > max_entries:
        raise InvalidArgument(f"{field} has {len(values)} entries; the limit is {max_entries}")
    for key in values:
        if not key:
            raise InvalidArgument(f"{field} has an empty label key")
        if len(key) > MAX_NAME_BYTES or len(values[key]) > MAX_NAME_BYTES:
            raise InvalidArgument(f"{field}[{key[:32]}] is too long")
    return dict(values)


def enum_value(value: int, enum_descriptor: object, field: str) -> int:
    """Reject enum numbers the proto does not define (proto3 keeps unknown values as ints)."""
    if value not in enum_descriptor.values_by_number:  # type: ignore[attr-defined]
        names = ", ".join(v.name for v in enum_descriptor.values)  # type: ignore[attr-defined]
        raise InvalidArgument(f"{field}: unknown enum value {value} (expected one of {names})")
    return value


def port(value: int, field: str, *, required: bool = True) -> int:
    if value == 0 and not required:
        return value
    if not 0 < value <= 65535:
        raise InvalidArgument(f"{field} must be a TCP port in 1..65535, got {value}")
    return value
