"""Helpers shared by servicers."""

from __future__ import annotations

from google.protobuf.message import Message

from gcs.base.protowire import framed_size
from gcs.proto import gcs_service_pb2
from gcs.rpc.errors import GcsError, RayStatusCode, ResourceExhausted, ray_code_for


def ok_status() -> gcs_service_pb2.GcsStatus:
    return gcs_service_pb2.GcsStatus(code=RayStatusCode.OK)


def error_status(err: GcsError) -> gcs_service_pb2.GcsStatus:
    """Ray's in-reply status for services that report errors in ``GcsStatus``."""
    return gcs_service_pb2.GcsStatus(code=int(ray_code_for(err)), message=err.message)


class ReplySize:
    """The running encoded size of what a reply carries, entry by entry, so a reply that
    grows with stored data stops being built at ``limit`` (ResourceExhausted naming it)
    instead of being built whole and refused on the way out (InternalKVKeys over 10,000
    64 KiB keys peaked at 3.3 GiB to answer RESOURCE_EXHAUSTED)."""

    __slots__ = ("count", "limit", "size", "what")

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.size = 0
        self.count = 0

    def add(self, message: Message) -> None:
        self.add_bytes(message.ByteSize())

    def add_bytes(self, size: int) -> None:
        """One length-delimited entry of ``size`` bytes (plus its tag and length)."""
        self.size += framed_size(size)
        self.count += 1
        if self.size > self.limit:
            raise reply_too_large(self.limit, f"{self.count} {self.what}")


def reply_too_large(limit: int, what: str) -> ResourceExhausted:
    return ResourceExhausted(
        f"the reply would be larger than {limit} bytes (limits.max_reply_bytes) at {what}; "
        "ask for less (a limit, filters or a narrower prefix)"
    )
