"""Protobuf -> JSON-ready dicts for CLI output: ids as hex (as Ray prints them), not base64.

``json_format.MessageToDict`` renders every ``bytes`` field in base64; node, job and
placement-group ids then do not match what ``ray status`` or the logs show.  Here every
bytes field becomes lowercase hex; everything else is as ``MessageToDict`` gives it
(original proto field names, so keys match the ``.proto``).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message


def message_to_dict(message: Message) -> dict[str, Any]:
    raw = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return _hexify(message, raw)


def _hexify(message: Message, raw: dict[str, Any]) -> dict[str, Any]:
    descriptor: Descriptor = message.DESCRIPTOR
    for field in descriptor.fields:
        if field.name not in raw:
            continue
        value = getattr(message, field.name)
        if field.type == FieldDescriptor.TYPE_BYTES:
            if _is_repeated(field):
                raw[field.name] = [item.hex() for item in value]
            else:
                raw[field.name] = value.hex()
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    raw[field.name] = {
                        k: _hexify(value[_map_key(field, k)], v) for k, v in raw[field.name].items()
                    }
                elif value_field.type == FieldDescriptor.TYPE_BYTES:
                    raw[field.name] = {k: value[_map_key(field, k)].hex() for k in raw[field.name]}
            elif _is_repeated(field):
                raw[field.name] = [
                    _hexify(item, sub) if isinstance(sub, dict) else sub
                    for item, sub in zip(value, raw[field.name], strict=True)
                ]
            elif isinstance(raw[field.name], dict):
                raw[field.name] = _hexify(value, raw[field.name])
    return raw


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _map_key(field: FieldDescriptor, key: str) -> Any:
    key_field = field.message_type.fields_by_name["key"]
    if key_field.type == FieldDescriptor.TYPE_STRING:
        return key
    if key_field.type == FieldDescriptor.TYPE_BOOL:
        return key == "true"
    return int(key)
