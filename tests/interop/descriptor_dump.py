"""Dump protobuf descriptors of generated ``*_pb2`` modules as plain JSON-able data.

Self-contained (imports only ``google.protobuf`` and the stdlib): the same source runs inside
the Ray venvs (its text is sent as a script) and in the test process, so both sides of a
wire comparison are described by one function.

Shape::

    {"messages": {full_name: {"map_entry": bool,
                              "fields": {name: {number, type, label, type_name,
                                                oneof, proto3_optional}}}},
     "enums":    {full_name: {value_name: number}},
     "services": {full_name: {method: {input, output, client_streaming, server_streaming}}}}
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

from google.protobuf import descriptor_pb2


def _fields(msg: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for field in msg.field:
        oneof = msg.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else None
        out[field.name] = {
            "number": field.number,
            "type": descriptor_pb2.FieldDescriptorProto.Type.Name(field.type),
            "label": descriptor_pb2.FieldDescriptorProto.Label.Name(field.label),
            "type_name": field.type_name.lstrip("."),
            "oneof": oneof,
            "proto3_optional": field.proto3_optional,
        }
    return out


def _walk_message(prefix: str, msg: Any, dump: dict[str, dict[str, Any]]) -> None:
    full = f"{prefix}.{msg.name}"
    dump["messages"][full] = {"map_entry": msg.options.map_entry, "fields": _fields(msg)}
    for enum in msg.enum_type:
        dump["enums"][f"{full}.{enum.name}"] = {v.name: v.number for v in enum.value}
    for nested in msg.nested_type:
        _walk_message(full, nested, dump)


def dump_file(serialized: bytes, dump: dict[str, dict[str, Any]]) -> None:
    """Add everything ``FileDescriptorProto`` bytes define to ``dump``."""
    fd = descriptor_pb2.FileDescriptorProto.FromString(serialized)
    for msg in fd.message_type:
        _walk_message(fd.package, msg, dump)
    for enum in fd.enum_type:
        dump["enums"][f"{fd.package}.{enum.name}"] = {v.name: v.number for v in enum.value}
    for service in fd.service:
        dump["services"][f"{fd.package}.{service.name}"] = {
            m.name: {
                "input": m.input_type.lstrip("."),
                "output": m.output_type.lstrip("."),
                "client_streaming": m.client_streaming,
                "server_streaming": m.server_streaming,
            }
            for m in service.method
        }


def dump_modules(module_names: list[str]) -> dict[str, Any]:
    """Descriptors of every importable module in ``module_names`` (missing ones listed)."""
    dump: dict[str, Any] = {"messages": {}, "enums": {}, "services": {}, "missing_modules": []}
    for name in module_names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            dump["missing_modules"].append(name)
            continue
        dump_file(module.DESCRIPTOR.serialized_pb, dump)
    return dump


if __name__ == "__main__" and len(sys.argv) > 1:  # not when sent as ``-c`` text
    print(json.dumps(dump_modules(sys.argv[1:]), sort_keys=True))
