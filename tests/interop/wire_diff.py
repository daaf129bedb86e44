"""Compare descriptor dumps (see ``descriptor_dump``): ours vs Ray 2.60, with ant-ray 2.44.

Rules, all in Ray's naming (ours ``gcs.*`` is renamed ``ray.*`` first):

* A message, enum or service of ours that Ray 2.60 has must match Ray's: every Ray field /
  value / method is present and identical (number, type, label, type_name, oneof, proto3
  optional; method input/output and streaming).
* Anything Ray 2.60 lacks must match ant-ray 2.44.1.1's definition the same way.
* What neither has, and any extra field / enum value / method, must be on the allow-list,
  exactly (same container, name and number).  A listed addition must not collide with a
  number or name the reference defines, and, when ant-ray has it, must equal ant-ray's.

Every problem is one readable line; an empty list means wire-identical.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Dump = Mapping[str, Any]


@dataclass(frozen=True)
class AllowList:
    fields: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(message, field name) -> field number: fields we add to a reference message."""
    enum_values: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(enum, value name) -> number: values we add to a reference enum."""
    messages: frozenset[str] = frozenset()
    """Messages (and map-entry types) neither reference defines."""
    methods: frozenset[tuple[str, str]] = frozenset()
    """(service, method) pairs neither reference defines."""
    partial_services: frozenset[str] = frozenset()
    """Services we only call, declaring the methods we use (the others may be missing)."""


def rename(name: str) -> str:
    return re.sub(r"^(\.?)gcs\.", r"\1ray.", name)


def renamed(dump: Dump) -> dict[str, Any]:
    """``dump`` with our package names turned into Ray's (keys and references)."""
    messages = {
        rename(name): {
            "map_entry": msg["map_entry"],
            "fields": {
                f: dict(spec, type_name=rename(spec["type_name"]))
                for f, spec in msg["fields"].items()
            },
        }
        for name, msg in dump["messages"].items()
    }
    services = {
        rename(name): {
            m: dict(spec, input=rename(spec["input"]), output=rename(spec["output"]))
            for m, spec in methods.items()
        }
        for name, methods in dump["services"].items()
    }
    enums = {rename(name): dict(values) for name, values in dump["enums"].items()}
    return {"messages": messages, "enums": enums, "services": services}


def _reference(kind: str, name: str, ray: Dump, ant: Dump) -> tuple[str, Any] | None:
    if name in ray[kind]:
        return "Ray 2.60", ray[kind][name]
    if name in ant[kind]:
        return "ant-ray 2.44", ant[kind][name]
    return None


def _compare_message(name: str, ours: Any, where: str, ref: Any, allowed: AllowList) -> list[str]:
    problems = []
    if ours["map_entry"] != ref["map_entry"]:
        problems.append(f"message {name}: map_entry ours={ours['map_entry']} {where}=")
    for fname, spec in ref["fields"].items():
        mine = ours["fields"].get(fname)
        if mine is None:
            problems.append(f"message {name}: field {fname} = {spec['number']} missing")
            continue
        for attr in ("number", "type", "label", "type_name", "oneof", "proto3_optional"):
            if mine[attr] != spec[attr]:
                problems.append(
                    f"message {name}: field {fname}: {attr} ours={mine[attr]!r} "
                    f"{where}={spec[attr]!r}"
                )
    for fname, spec in ours["fields"].items():
        if fname in ref["fields"]:
            continue
        listed = allowed.fields.get((name, fname))
        if listed != spec["number"]:
            problems.append(
                f"message {name}: field {fname} = {spec['number']} is not in {where} "
                f"and not on the allow-list" + (f" (listed as {listed})" if listed else "")
            )
    return problems


def _compare_enum(name: str, ours: Any, where: str, ref: Any, allowed: AllowList) -> list[str]:
    problems = []
    for vname, number in ref.items():
        if ours.get(vname) != number:
            problems.append(f"enum {name}: value {vname} ours={ours.get(vname)} {where}={number}")
    for vname, number in ours.items():
        if vname not in ref and allowed.enum_values.get((name, vname)) != number:
            problems.append(
                f"enum {name}: value {vname} = {number} is not in {where} and not on the allow-list"
            )
    return problems


def _compare_service(name: str, ours: Any, where: str, ref: Any, allowed: AllowList) -> list[str]:
    problems = []
    for method, spec in ref.items():
        mine = ours.get(method)
        if mine is None:
            if name not in allowed.partial_services:
                problems.append(f"service {name}: method {method} missing")
        elif mine != spec:
            problems.append(f"service {name}: method {method}: ours={mine} {where}={spec}")
    for method in ours:
        if method not in ref and (name, method) not in allowed.methods:
            problems.append(
                f"service {name}: method {method} is not in {where} and not on the allow-list"
            )
    return problems


_COMPARE = {
    "messages": _compare_message,
    "enums": _compare_enum,
    "services": _compare_service,
}


def compare(ours: Dump, ray: Dump, ant: Dump, allowed: AllowList) -> list[str]:
    """Problems with our (already :func:`renamed`) dump against the references."""
    problems: list[str] = []
    for kind, check in _COMPARE.items():
        for name in sorted(ours[kind]):
            ref = _reference(kind, name, ray, ant)
            if ref is None:
                if kind == "messages" and name in allowed.messages:
                    continue
                if kind == "services" and all(
                    (name, m) in allowed.methods for m in ours[kind][name]
                ):
                    continue
                problems.append(f"{kind[:-1]} {name} is in neither Ray 2.60 nor ant-ray 2.44")
                continue
            where, spec = ref
            problems.extend(check(name, ours[kind][name], where, spec, allowed))
    return problems


def allow_list_problems(ray: Dump, ant: Dump, allowed: AllowList) -> list[str]:
    """Listed additions must not clash with Ray 2.60 and must agree with ant-ray's numbers."""
    problems = []
    for (msg, fname), number in sorted(allowed.fields.items()):
        ray_fields = ray["messages"].get(msg, {}).get("fields", {})
        if fname in ray_fields:
            problems.append(f"allow-listed field {msg}.{fname} is a Ray 2.60 field")
        clash = [f for f, s in ray_fields.items() if s["number"] == number]
        if clash:
            problems.append(f"allow-listed field {msg}.{fname} = {number} collides with {clash}")
        ant_spec = ant["messages"].get(msg, {}).get("fields", {}).get(fname)
        if ant_spec is not None and ant_spec["number"] != number:
            problems.append(
                f"allow-listed field {msg}.{fname} = {number} but ant-ray has {ant_spec['number']}"
            )
    for (enum, vname), number in sorted(allowed.enum_values.items()):
        ray_values = ray["enums"].get(enum, {})
        if vname in ray_values:
            problems.append(f"allow-listed value {enum}.{vname} is a Ray 2.60 value")
        clash = [v for v, n in ray_values.items() if n == number]
        if clash:
            problems.append(f"allow-listed value {enum}.{vname} = {number} collides with {clash}")
        ant_number = ant["enums"].get(enum, {}).get(vname)
        if ant_number is not None and ant_number != number:
            problems.append(
                f"allow-listed value {enum}.{vname} = {number} but ant-ray has {ant_number}"
            )
    for msg in sorted(allowed.messages):
        if msg in ray["messages"] or msg in ant["messages"]:
            problems.append(f"allow-listed message {msg} exists in a reference: compare it instead")
    for service, method in sorted(allowed.methods):
        for where, dump in (("Ray 2.60", ray), ("ant-ray 2.44", ant)):
            if method in dump["services"].get(service, {}):
                problems.append(f"allow-listed method {service}.{method} exists in {where}")
    return problems


def ant_ray_field_mismatches(ours: Dump, ant: Dump, allowed: AllowList) -> list[str]:
    """Allow-listed fields ant-ray also has must be defined as ant-ray defines them."""
    problems = []
    for msg, fname in sorted(allowed.fields):
        mine = ours["messages"].get(msg, {}).get("fields", {}).get(fname)
        theirs = ant["messages"].get(msg, {}).get("fields", {}).get(fname)
        if mine is not None and theirs is not None and mine != theirs:
            problems.append(f"field {msg}.{fname}: ours={mine} ant-ray 2.44={theirs}")
    return problems
