"""Ray's gRPC method paths over our renamed proto package.

Our messages live in proto package ``gcs.rpc`` so they can be loaded next to ``ray``'s
``ray.rpc`` in one process.  On the wire only the method path names a package, so we keep
Ray's: service ``gcs.rpc.NodeInfoGcsService`` is served and called as
``/ray.rpc.NodeInfoGcsService/<Method>``.
"""

from __future__ import annotations

from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor


def wire_service_name(service: ServiceDescriptor) -> str:
    full = service.full_name
    if full.startswith("gcs."):
        return "ray." + full[len("gcs.") :]
    return full


def method_path(method: MethodDescriptor) -> str:
    return f"/{wire_service_name(method.containing_service)}/{method.name}"


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of ``n`` >= 0 (for replies spliced by hand)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
