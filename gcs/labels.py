"""Ray's label selector strings -> ``LabelSelector`` protos.

``"v"`` -> IN [v]; ``"in(a,b)"`` -> IN [a, b]; ``"!v"`` -> NOT_IN [v]; ``"!in(a,b)"`` ->
NOT_IN [a, b] (gcs-server.md §7.1).  Constraints keep the dict's order, as Ray's do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gcs.proto import common_pb2

_IN = re.compile(r"^in\((.*)\)$")


class LabelSelectorError(ValueError):
    pass


def parse_value(key: str, raw: str) -> common_pb2.LabelSelectorConstraint:
    text = raw.strip()
    negate = text.startswith("!")
    if negate:
        text = text[1:].strip()
    match = _IN.match(text)
    values = [v.strip() for v in match.group(1).split(",")] if match else [text]
    if not values or any(not v for v in values):
        raise LabelSelectorError(f"label selector {key!r}: empty value in {raw!r}")
    op = common_pb2.LABEL_OPERATOR_NOT_IN if negate else common_pb2.LABEL_OPERATOR_IN
    return common_pb2.LabelSelectorConstraint(label_key=key, operator=op, label_values=values)


def parse_selector(selector: Mapping[str, str]) -> common_pb2.LabelSelector:
    out = common_pb2.LabelSelector()
    for key, raw in selector.items():
        if not key:
            raise LabelSelectorError("label selector has an empty key")
        out.label_constraints.append(parse_value(key, raw))
    return out
