"""Proto descriptors compiled into Ray's C++ binaries (for protos the wheel ships no
``*_pb2`` of, such as ``ray_syncer.proto``).

A C++ protobuf binary embeds each ``.proto`` as a serialized ``FileDescriptorProto`` whose
first field is the file name.  We find that name, then walk the wire format field by field
until a field that no ``FileDescriptorProto`` has (the blob is followed by unrelated data).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from google.protobuf import descriptor_pb2

GCS_SERVER = "ray/core/src/ray/gcs/gcs_server"
SYNCER_PROTO = "src/ray/protobuf/ray_syncer.proto"


_FILE_FIELDS = range(1, 15)
"""FileDescriptorProto's field numbers (name=1 ... edition=14)."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def embedded_file(binary: bytes, proto_path: str) -> bytes:
    name = proto_path.encode()
    start = binary.find(b"\n" + bytes([len(name)]) + name)
    if start < 0:
        raise LookupError(f"{proto_path} is not embedded in the binary")
    pos = start
    while pos < len(binary):
        tag, after = _varint(binary, pos)
        number, wire = tag >> 3, tag & 7
        if number not in _FILE_FIELDS or wire not in (0, 2):
            break
        if wire == 0:
            _, pos = _varint(binary, after)
        else:
            length, body = _varint(binary, after)
            pos = body + length
    blob = binary[start:pos]
    parsed = descriptor_pb2.FileDescriptorProto.FromString(blob)
    if parsed.name != proto_path or parsed.SerializeToString() != blob:
        raise LookupError(f"no clean descriptor of {proto_path} in the binary")
    return blob


def syncer_descriptor_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        binary = zf.read(GCS_SERVER)
    return embedded_file(binary, SYNCER_PROTO)
