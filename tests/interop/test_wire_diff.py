"""The descriptor comparison reports each kind of wire difference (no venv needed)."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.interop.wire_diff import (
    AllowList,
    allow_list_problems,
    ant_ray_field_mismatches,
    compare,
    renamed,
)


def _field(number: int, type_: str = "TYPE_STRING", **extra: Any) -> dict[str, Any]:
    spec = {
        "number": number,
        "type": type_,
        "label": "LABEL_OPTIONAL",
        "type_name": "",
        "oneof": None,
        "proto3_optional": False,
    }
    spec.update(extra)
    return spec


def _ray() -> dict[str, Any]:
    return {
        "messages": {
            "ray.rpc.Pub": {
                "map_entry": False,
                "fields": {
                    "channel": _field(1, "TYPE_ENUM", type_name="ray.rpc.Channel"),
                    "job": _field(2, "TYPE_MESSAGE", type_name="ray.rpc.Job", oneof="inner"),
                },
            },
            "ray.rpc.Job": {"map_entry": False, "fields": {"id": _field(1, "TYPE_BYTES")}},
        },
        "enums": {"ray.rpc.Channel": {"A": 0, "B": 1}},
        "services": {
            "ray.rpc.Svc": {
                "Get": {
                    "input": "ray.rpc.Job",
                    "output": "ray.rpc.Pub",
                    "client_streaming": False,
                    "server_streaming": False,
                }
            }
        },
    }


def _ours_from(ray: dict[str, Any]) -> dict[str, Any]:
    """Ray's dump spelled in our package, as our generated modules would describe it."""
    return json.loads(json.dumps(ray).replace('"ray.', '"gcs.'))


EMPTY = {"messages": {}, "enums": {}, "services": {}}


class TestCompare:
    def test_identical_after_rename_has_no_problems(self) -> None:
        """Our ``gcs.rpc`` names are compared as Ray's ``ray.rpc`` names."""
        assert compare(renamed(_ours_from(_ray())), _ray(), EMPTY, AllowList()) == []

    def test_changed_field_number_is_reported_with_both_values(self) -> None:
        """A renumbered field names the message, field, and both numbers."""
        ours = _ours_from(_ray())
        ours["messages"]["gcs.rpc.Job"]["fields"]["id"]["number"] = 5
        assert compare(renamed(ours), _ray(), EMPTY, AllowList()) == [
            "message ray.rpc.Job: field id: number ours=5 Ray 2.60=1"
        ]

    def test_oneof_type_name_and_optional_differences_are_reported(self) -> None:
        """Oneof membership, referenced type and proto3 optional are all part of identity."""
        ours = _ours_from(_ray())
        job = ours["messages"]["gcs.rpc.Pub"]["fields"]["job"]
        job.update(oneof=None, type_name="gcs.rpc.Other", proto3_optional=True)
        problems = compare(renamed(ours), _ray(), EMPTY, AllowList())
        assert [p.split(":")[2].strip().split(" ")[0] for p in problems] == [
            "type_name",
            "oneof",
            "proto3_optional",
        ]

    def test_missing_field_enum_value_and_method_are_reported(self) -> None:
        """Dropping anything Ray defines is a difference."""
        ours = _ours_from(_ray())
        del ours["messages"]["gcs.rpc.Pub"]["fields"]["job"]
        del ours["enums"]["gcs.rpc.Channel"]["B"]
        del ours["services"]["gcs.rpc.Svc"]["Get"]
        assert compare(renamed(ours), _ray(), EMPTY, AllowList()) == [
            "message ray.rpc.Pub: field job = 2 missing",
            "enum ray.rpc.Channel: value B ours=None Ray 2.60=1",
            "service ray.rpc.Svc: method Get missing",
        ]

    def test_unlisted_additions_fail_and_listed_ones_pass_only_with_their_number(self) -> None:
        """An extra field/value is fine only when the allow-list names it with that number."""
        ours = _ours_from(_ray())
        ours["messages"]["gcs.rpc.Pub"]["fields"]["vc"] = _field(20)
        ours["enums"]["gcs.rpc.Channel"]["VC"] = 11
        assert len(compare(renamed(ours), _ray(), EMPTY, AllowList())) == 2
        exact = AllowList(
            fields={("ray.rpc.Pub", "vc"): 20}, enum_values={("ray.rpc.Channel", "VC"): 11}
        )
        assert compare(renamed(ours), _ray(), EMPTY, exact) == []
        wrong = AllowList(
            fields={("ray.rpc.Pub", "vc"): 21}, enum_values={("ray.rpc.Channel", "VC"): 11}
        )
        assert compare(renamed(ours), _ray(), EMPTY, wrong) == [
            "message ray.rpc.Pub: field vc = 20 is not in Ray 2.60 and not on the "
            "allow-list (listed as 21)"
        ]

    def test_messages_ray_lacks_are_checked_against_ant_ray(self) -> None:
        """A message only ant-ray has must match ant-ray; one neither has must be listed."""
        ant = {
            "messages": {"ray.rpc.VC": {"map_entry": False, "fields": {"id": _field(1)}}},
            "enums": {},
            "services": {},
        }
        ours = _ours_from(_ray())
        ours["messages"]["gcs.rpc.VC"] = {"map_entry": False, "fields": {"id": _field(2)}}
        ours["messages"]["gcs.rpc.New"] = {"map_entry": False, "fields": {}}
        assert compare(renamed(ours), _ray(), ant, AllowList()) == [
            "message ray.rpc.New is in neither Ray 2.60 nor ant-ray 2.44",
            "message ray.rpc.VC: field id: number ours=2 ant-ray 2.44=1",
        ]
        listed = AllowList(messages=frozenset({"ray.rpc.New"}))
        assert len(compare(renamed(ours), _ray(), ant, listed)) == 1


class TestAllowList:
    def test_listed_field_colliding_with_a_ray_number_is_reported(self) -> None:
        """A listed addition may not reuse a number Ray already gave a field."""
        allowed = AllowList(fields={("ray.rpc.Pub", "vc"): 2})
        assert allow_list_problems(_ray(), EMPTY, allowed) == [
            "allow-listed field ray.rpc.Pub.vc = 2 collides with ['job']"
        ]

    def test_listed_enum_value_colliding_or_disagreeing_with_ant_ray_is_reported(self) -> None:
        """Enum additions must avoid Ray's numbers and use ant-ray's where ant-ray has them."""
        ant = {"messages": {}, "enums": {"ray.rpc.Channel": {"VC": 11}}, "services": {}}
        allowed = AllowList(enum_values={("ray.rpc.Channel", "VC"): 1})
        assert allow_list_problems(_ray(), ant, allowed) == [
            "allow-listed value ray.rpc.Channel.VC = 1 collides with ['B']",
            "allow-listed value ray.rpc.Channel.VC = 1 but ant-ray has 11",
        ]

    def test_listing_something_a_reference_defines_is_reported(self) -> None:
        """The allow-list cannot be used to skip comparing a message or method Ray has."""
        allowed = AllowList(
            messages=frozenset({"ray.rpc.Job"}), methods=frozenset({("ray.rpc.Svc", "Get")})
        )
        assert len(allow_list_problems(_ray(), EMPTY, allowed)) == 2

    def test_added_field_must_match_ant_rays_definition(self) -> None:
        """Same number is not enough: type and oneof must be ant-ray's too."""
        ant = {
            "messages": {"ray.rpc.Pub": {"map_entry": False, "fields": {"vc": _field(20)}}},
            "enums": {},
            "services": {},
        }
        ours = renamed(_ours_from(_ray()))
        ours["messages"]["ray.rpc.Pub"]["fields"]["vc"] = _field(20, "TYPE_BYTES")
        allowed = AllowList(fields={("ray.rpc.Pub", "vc"): 20})
        assert len(ant_ray_field_mismatches(ours, ant, allowed)) == 1
        ours["messages"]["ray.rpc.Pub"]["fields"]["vc"] = copy.deepcopy(_field(20))
        assert ant_ray_field_mismatches(ours, ant, allowed) == []
