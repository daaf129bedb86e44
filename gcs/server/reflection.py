"""Server reflection under the names we actually serve: ``ray.rpc.*``.

Our messages live in proto package ``gcs.rpc`` (so they load next to ``ray``), but the wire
paths are Ray's ``/ray.rpc.<Service>/<Method>``.  Reflecting our own descriptor pool would
list ``gcs.rpc.*`` services, which answer UNIMPLEMENTED; so reflection gets a private pool
holding the same files with the package renamed back to Ray's.  ``grpcurl`` (or any
reflection client) then lists, describes and calls ``ray.rpc.NodeInfoGcsService/...``.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor
from google.protobuf.descriptor_pool import DescriptorPool

OUR_PREFIX = "gcs.rpc"
WIRE_PREFIX = "ray.rpc"


def _rename(name: str) -> str:
    """``gcs.rpc.X`` / ``.gcs.rpc.X`` -> the ``ray.rpc`` spelling; other names unchanged."""
    for ours, wire in ((OUR_PREFIX, WIRE_PREFIX), ("." + OUR_PREFIX, "." + WIRE_PREFIX)):
        if name == ours or name.startswith(ours + "."):
            return wire + name[len(ours) :]
    return name


def _rename_messages(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    for message in messages:
        for field in [*message.field, *message.extension]:
            if field.type_name:
                field.type_name = _rename(field.type_name)
            if field.extendee:
                field.extendee = _rename(field.extendee)
        _rename_messages(message.nested_type)


def wire_file(file: FileDescriptor) -> descriptor_pb2.FileDescriptorProto:
    """A copy of ``file`` with every ``gcs.rpc`` package and type reference renamed."""
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    proto.package = _rename(proto.package)
    _rename_messages(proto.message_type)
    for ext in proto.extension:
        ext.type_name = _rename(ext.type_name) if ext.type_name else ""
        ext.extendee = _rename(ext.extendee) if ext.extendee else ""
    for service in proto.service:
        for method in service.method:
            method.input_type = _rename(method.input_type)
            method.output_type = _rename(method.output_type)
    return proto


def wire_pool(services: Iterable[ServiceDescriptor]) -> DescriptorPool:
    """A pool with the files defining ``services`` (and their imports), renamed."""
    pool = DescriptorPool()
    added: set[str] = set()

    def add(file: FileDescriptor) -> None:
        if file.name in added:
            return
        for dep in file.dependencies:
            add(dep)
        pool.Add(wire_file(file))
        added.add(file.name)

    for service in services:
        add(service.file)
    return pool
