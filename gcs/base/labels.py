"""Ray 2.60's label-selector syntax: validation messages and the wire form Ray sends.

Facts taken from Ray 2.60 (``ray._private.label_utils`` and what its C++ ``GcsClient`` puts on
the wire, observed by tests/interop/test_request_resources_wire.py):

* ``"v"`` -> IN [v]; ``"!v"`` -> NOT_IN [v]; ``"in(a,b)"`` -> IN [a, b];
  ``"!in(a,b)"`` -> NOT_IN [a, b]; ``"(a,b)"`` is a literal value; ``""`` -> IN [""].
* Values inside ``in(...)`` are split on ``,`` and *not* trimmed (``"in(a, b)"`` sends
  ``" b"``) and duplicates are dropped.  Ray orders values and constraints by hash (it varies
  per process); we keep the caller's order, which is one of Ray's possible orders.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gcs.proto import common_pb2

_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
_PREFIX_RE = re.compile(rf"^(({_LABEL})?(\.({_LABEL})?)*)$")
_NAME_RE = re.compile(_LABEL)
_OPERATORS = ("in",)
_SELECTOR_RE = re.compile(
    rf"^!?(?:{'|'.join(_OPERATORS)})?\({_LABEL}(?:, ?{_LABEL})*\)$|^!?{_LABEL}$"
)
_CHARSET_HINT = (
    "with an alphanumeric character ([a-z0-9A-Z]) with dashes (-), underscores (_),"
    "dots (.), and alphanumerics between."
)


def label_key_error(key: str) -> str | None:
    """Ray's message for an invalid selector key, or None."""
    if "/" in key:
        prefix, name = key.rsplit("/", 1)
        if len(prefix) > 253 or not _PREFIX_RE.fullmatch(prefix):
            return (
                f"Invalid label key prefix `{prefix}`. Prefix must be a series of DNS labels "
                f"separated by dots (.), not longer than 253 characters in total."
            )
    else:
        name = key
    if len(name) > 63 or not _NAME_RE.fullmatch(name):
        return (
            f"Invalid label key name `{name}`. Name must be 63 chars or less beginning and "
            f"ending {_CHARSET_HINT}"
        )
    return None


def selector_value_error(value: str) -> str | None:
    """Ray's message for an invalid selector value (``""`` is valid), or None."""
    if value == "" or _SELECTOR_RE.fullmatch(value):
        return None
    operators = "{" + ", ".join(repr(op) for op in _OPERATORS) + "}"
    return (
        f"Invalid label selector value `{value}`. The label selector value should contain "
        f"optional operators and a label value. Supported operators are: ! and {operators}. "
        f"Value must be 63 chars or less beginning and ending {_CHARSET_HINT}"
    )


def label_selector_error(selector: Mapping[str, str]) -> str | None:
    """The first problem in ``selector`` (keys, then values, in order), or None."""
    for key, value in selector.items():
        problem = label_key_error(key)
        if problem is None and value is not None:
            problem = selector_value_error(value)
        if problem is not None:
            return problem
    return None


def selector_constraint(key: str, value: str) -> common_pb2.LabelSelectorConstraint:
    """One ``key: value`` selector entry in the form Ray's client sends it."""
    negate = value.startswith("!")
    body = value[1:] if negate else value
    if body.startswith("in(") and body.endswith(")"):
        values = list(dict.fromkeys(body[3:-1].split(",")))
    else:
        values = [body]
    operator = common_pb2.LABEL_OPERATOR_NOT_IN if negate else common_pb2.LABEL_OPERATOR_IN
    return common_pb2.LabelSelectorConstraint(label_key=key, operator=operator, label_values=values)


def selector_proto(selector: Mapping[str, str]) -> common_pb2.LabelSelector:
    return common_pb2.LabelSelector(
        label_constraints=[selector_constraint(k, v) for k, v in selector.items()]
    )
