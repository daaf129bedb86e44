"""Request validation shared by servicers: pure functions, each error names the field.

Every function returns the value it checked (so call sites read ``x = validate.f(x, ...)``)
or raises :class:`gcs.base.errors.InvalidArgument`.  Limits come from
:class:`gcs.config.RequestLimits`, passed in by the caller.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping, Sized
from typing import Any, TypeVar

from gcs.base.errors import InvalidArgument
from gcs.config import RequestLimits

T = TypeVar("T")
S = TypeVar("S", bound=Sized)

RESOURCE_AMOUNT_MAX = (2**63 - 1) / 10_000
"""Ray keeps resource amounts as fixed point (int64 in units of 1/10,000); larger amounts
overflow it."""
_HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_SHOWN = 48
"""Characters of an offending value quoted in a message (values can be megabytes)."""


def _shown(value: str | bytes) -> str:
    text = value.hex() if isinstance(value, bytes) else value
    return repr(text[:_SHOWN] + ("..." if len(text) > _SHOWN else ""))


def _utf8_len(value: str, limit: int) -> int:
    """UTF-8 length, without encoding values that are too long by their character count."""
    if len(value) > limit or len(value) * 4 <= limit:
        return len(value)
    return len(value.encode("utf-8", "surrogatepass"))


# -- sizes ---------------------------------------------------------------------------------
def text(value: str, field: str, max_bytes: int, *, required: bool = False) -> str:
    if required and not value:
        raise InvalidArgument(f"{field} is required")
    if _utf8_len(value, max_bytes) > max_bytes:
        raise InvalidArgument(f"{field} is longer than {max_bytes} bytes ({_shown(value)})")
    return value


def blob(value: bytes, field: str, max_bytes: int, *, required: bool = False) -> bytes:
    if required and not value:
        raise InvalidArgument(f"{field} is required")
    if len(value) > max_bytes:
        raise InvalidArgument(f"{field} is {len(value)} bytes; the limit is {max_bytes}")
    return value


def fixed_id(value: bytes, field: str, size: int, *, required: bool = False) -> bytes:
    """A binary id of exactly ``size`` bytes; empty is allowed unless ``required``."""
    if not value:
        if required:
            raise InvalidArgument(f"{field} is required")
        return value
    if len(value) != size:
        raise InvalidArgument(f"{field} must be {size} bytes, got {len(value)}")
    return value


def entries(values: S, field: str, max_entries: int) -> S:
    if len(values) > max_entries:
        raise InvalidArgument(f"{field} has {len(values)} entries; the limit is {max_entries}")
    return values


def record(message: Any, field: str, max_bytes: int) -> Any:
    """A message persisted as one record: its encoded size is bounded."""
    size = message.ByteSize()
    if size > max_bytes:
        raise InvalidArgument(f"{field} is {size} bytes encoded; the limit is {max_bytes}")
    return message


def strings_in(message: Any, field: str, max_bytes: int) -> Any:
    """Every string and bytes value anywhere in ``message`` (map keys included) is at most
    ``max_bytes``; the error names the path, e.g. ``spec.bundles[2].label_selector[k]``."""
    for desc, value in message.ListFields():
        path = f"{field}.{desc.name}"
        if desc.message_type is not None and desc.message_type.GetOptions().map_entry:
            value_desc = desc.message_type.fields_by_name["value"]
            for key, item in value.items():
                if isinstance(key, str | bytes):
                    _too_long(f"{path} key", key, max_bytes)
                _check_item(item, value_desc, f"{path}[{_key(key)}]", max_bytes)
        elif desc.is_repeated:
            for i, item in enumerate(value):
                _check_item(item, desc, f"{path}[{i}]", max_bytes)
        else:
            _check_item(value, desc, path, max_bytes)
    return message


def _key(key: object) -> str:
    return key[:_SHOWN] if isinstance(key, str) else str(key)[:_SHOWN]


def _too_long(path: str, value: str | bytes, max_bytes: int) -> None:
    if isinstance(value, str):
        text(value, path, max_bytes)
    else:
        blob(value, path, max_bytes)


def _check_item(value: Any, desc: Any, path: str, max_bytes: int) -> None:
    if isinstance(value, str | bytes):
        _too_long(path, value, max_bytes)
    elif desc.message_type is not None:
        strings_in(value, path, max_bytes)


# -- numbers -------------------------------------------------------------------------------
def amounts_in(message: Any, field: str) -> Any:
    """Every double/float anywhere in ``message`` is a valid resource amount (for messages
    whose only floating-point values are resource amounts: bundles, requests, reports)."""
    for desc, value in message.ListFields():
        path = f"{field}.{desc.name}"
        if desc.message_type is not None and desc.message_type.GetOptions().map_entry:
            value_desc = desc.message_type.fields_by_name["value"]
            for key, item in value.items():
                _amount_item(item, value_desc, f"{path}[{_key(key)}]")
        elif desc.is_repeated:
            for i, item in enumerate(value):
                _amount_item(item, desc, f"{path}[{i}]")
        else:
            _amount_item(value, desc, path)
    return message


def _amount_item(value: Any, desc: Any, path: str) -> None:
    if isinstance(value, float):
        resource_amount(value, path)
    elif desc.message_type is not None:
        amounts_in(value, path)


def non_negative(value: int, field: str) -> int:
    if value < 0:
        raise InvalidArgument(f"{field} must be >= 0, got {value}")
    return value


def resource_amount(amount: float, field: str) -> float:
    if math.isnan(amount) or math.isinf(amount):
        raise InvalidArgument(f"{field} must be finite, got {amount}")
    if amount < 0:
        raise InvalidArgument(f"{field} must be >= 0, got {amount}")
    if amount > RESOURCE_AMOUNT_MAX:
        raise InvalidArgument(f"{field} must be <= {RESOURCE_AMOUNT_MAX:.6g}, got {amount}")
    return amount


def resource_map(
    values: Mapping[str, float],
    field: str,
    limits: RequestLimits,
    *,
    max_entries: int | None = None,
) -> dict[str, float]:
    """Non-empty, bounded names; finite, non-negative amounts Ray's fixed point can hold."""
    entries(values, field, limits.max_map_entries if max_entries is None else max_entries)
    out: dict[str, float] = {}
    for name, amount in values.items():
        if not name:
            raise InvalidArgument(
                f"{field} has an empty resource name; every resource needs a non-empty name"
            )
        text(name, f"{field} resource name", limits.max_name_bytes)
        out[name] = resource_amount(amount, f"{field}[{name}]")
    return out


def label_map(values: Mapping[str, str], field: str, limits: RequestLimits) -> dict[str, str]:
    entries(values, field, limits.max_label_entries)
    for key, value in values.items():
        if not key:
            raise InvalidArgument(f"{field} has an empty label key")
        text(key, f"{field} key", limits.max_label_key_bytes)
        text(value, f"{field}[{key}]", limits.max_label_value_bytes)
    return dict(values)


def enum_value(value: int, enum_descriptor: object, field: str) -> int:
    """Reject enum numbers the proto does not define (proto3 keeps unknown values as ints)."""
    if value not in enum_descriptor.values_by_number:  # type: ignore[attr-defined]
        names = ", ".join(v.name for v in enum_descriptor.values)  # type: ignore[attr-defined]
        raise InvalidArgument(f"{field}: unknown enum value {value} (expected one of {names})")
    return value


# -- network -------------------------------------------------------------------------------
def port(value: int, field: str, *, required: bool = True) -> int:
    if value == 0 and not required:
        return value
    if not 0 < value <= 65535:
        raise InvalidArgument(f"{field} must be a TCP port in 1..65535, got {value}")
    return value


def host(value: str, field: str, max_bytes: int) -> str:
    """An address the GCS may dial: an IP literal or a host name of valid syntax.

    Any routable address is allowed (real clusters span machines); rejected are the empty
    string, over-long values, a scheme, path, port or user part, unspecified (``0.0.0.0``)
    and multicast addresses, and names that are not dot-separated labels of letters, digits,
    ``-`` and ``_`` (at most 63 each, no leading or trailing ``-``).
    """
    if not value:
        raise InvalidArgument(f"{field} is required")
    text(value, field, max_bytes)
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        ip = None
    if ip is not None:
        if ip.is_unspecified or ip.is_multicast:
            raise InvalidArgument(f"{field} must be a unicast address, got {_shown(value)}")
        return value
    name = value[:-1] if value.endswith(".") else value
    labels = name.split(".")
    if not name or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise InvalidArgument(
            f"{field} must be an IP address or a host name (letters, digits, '-', '_' and "
            f"dots; no scheme, port or path), got {_shown(value)}"
        )
    if labels[-1].isdigit():
        raise InvalidArgument(f"{field} is not a valid IP address: {_shown(value)}")
    return value
