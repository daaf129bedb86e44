"""Pure validators and click parameter types for CLI input; every error names the field.

JSON parsed from flags goes through :func:`strict_json`, which refuses ``NaN``/``Infinity``
literals and numbers that overflow to infinity (``1e309``), so nothing non-finite reaches a
request or an output document.
"""

from __future__ import annotations

import json
import math
from typing import Any

import click

NODE_ID_HEX_CHARS = 56

PORT = click.IntRange(1, 65535)
PORT_OR_ANY = click.IntRange(0, 65535)
"""0 = any free port."""
METRICS_PORT = click.IntRange(-1, 65535)
"""-1 = off, 0 = any free port."""
POSITIVE_INT = click.IntRange(min=1)
NON_NEGATIVE_INT = click.IntRange(min=0)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed (amounts must be finite numbers)")


def strict_json(text: str) -> Any:
    """``json.loads`` without NaN, Infinity or overflowing numbers."""

    def parse_float(raw: str) -> float:
        value = float(raw)
        if math.isinf(value):
            raise ValueError(f"{raw} is out of range (amounts must be finite numbers)")
        return value

    return json.loads(text, parse_constant=_reject_constant, parse_float=parse_float)


def _parse(text: str) -> Any:
    try:
        return strict_json(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON: {err}") from None


def resources(text: str | None) -> dict[str, float]:
    """A JSON object of resource name -> finite amount >= 0, e.g. ``{"CPU": 2}``."""
    if text is None or text.strip() == "":
        return {}
    return resource_dict(_parse(text))


def resource_dict(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError('expected a JSON object of resource -> amount, e.g. {"CPU": 2}')
    out: dict[str, float] = {}
    for name, amount in value.items():
        if not name:
            raise ValueError("a resource name is empty")
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            raise ValueError(f"{name}: amount must be a number, got {json.dumps(amount)}")
        try:
            number = float(amount)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ValueError(f"{name}: amount must be finite, got {number}")
        if number < 0:
            raise ValueError(f"{name}: amount must be >= 0, got {number:g}")
        out[str(name)] = number
    return out


def string_map(text: str | None, what: str = "label") -> dict[str, str]:
    """A JSON object of string -> string (labels, label selectors)."""
    if text is None or text.strip() == "":
        return {}
    value = _parse(text)
    if not isinstance(value, dict):
        raise ValueError(f'expected a JSON object of {what} -> string, e.g. {{"zone": "a"}}')
    for key, item in value.items():
        if not key:
            raise ValueError(f"a {what} key is empty")
        if not isinstance(item, str):
            raise ValueError(f"{key}: value must be a string, got {json.dumps(item)}")
    return dict(value)


def node_id(text: str) -> bytes:
    """A node id as Ray prints it: 56 hex characters (28 bytes)."""
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"expected {NODE_ID_HEX_CHARS} hex characters, got {text!r}") from None
    if len(raw) * 2 != NODE_ID_HEX_CHARS:
        raise ValueError(f"expected {NODE_ID_HEX_CHARS} hex characters, got {len(text)}")
    return raw


def check_address(text: str) -> str:
    """``host:port`` with a port in 1..65535 (a ``[v6]:port`` host is fine).  The error says
    only what is wrong; the caller names the value and where it came from."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError("not host:port (e.g. 127.0.0.1:6379)")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("the port must be in 1..65535")
    return text.strip()


def finite_float(
    value: float, field: str, *, minimum: float = 0.0, open_min: bool = False
) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, got {value}")
    if value < minimum or (open_min and value == minimum):
        op = ">" if open_min else ">="
        raise ValueError(f"{field} must be {op} {minimum:g}, got {value:g}")
    return value


class Validated(click.ParamType):
    """Wrap a pure validator as a click type: its ValueError becomes a BadParameter."""

    def __init__(self, name: str, fn: Any) -> None:
        self.name = name
        self._fn = fn

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self._fn(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


class FiniteFloat(click.ParamType):
    name = "number"

    def __init__(self, minimum: float = 0.0, *, open_min: bool = False) -> None:
        self._minimum = minimum
        self._open = open_min

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        try:
            return finite_float(number, "value", minimum=self._minimum, open_min=self._open)
        except ValueError as err:
            self.fail(str(err), param, ctx)


RESOURCES = Validated("json-resources", resources)
LABELS = Validated("json-labels", lambda text: string_map(text, "label"))
NODE_ID = Validated("node-id", node_id)
