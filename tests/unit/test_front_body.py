"""The front server's request body (gcs.front.body): what a handler is given."""

from __future__ import annotations

from typing import Any

from gcs.front.body import RequestBody
from gcs.proto import gcs_service_pb2 as G


class Released:
    """Stands in for the connection: counts the flow-control credit given back."""

    def __init__(self) -> None:
        self.bytes = 0

    def release(self, stream: Any, n: int) -> None:
        self.bytes += n


class Buffered:
    buffered = 0


def body_of(message: bytes, chunk: int = 16 << 10) -> tuple[RequestBody, Released]:
    framed = b"\x00" + len(message).to_bytes(4) + message
    body, conn = RequestBody(), Released()
    for at in range(0, len(framed), chunk):
        body.add(conn, Buffered(), framed[at : at + chunk], len(framed))  # type: ignore[arg-type]
    return body, conn


def test_a_large_request_is_decoded_from_the_buffer_not_from_copies() -> None:
    """A 511 MiB KV put was copied twice in ``take`` (the buffer to bytes, then the slice
    after the prefix): two more allocations of its size on the event loop.  From
    ``VIEW_MIN_BYTES`` (1 MiB) on, the handler gets a read-only view of the one buffer."""
    value = b"v" * (2 << 20)
    encoded = G.InternalKVPutRequest(namespace=b"n", key=b"k", value=value).SerializeToString()
    body, conn = body_of(encoded)
    raw, size = body.take(conn, Buffered(), None, 1 << 30)  # type: ignore[arg-type]
    assert isinstance(raw, memoryview) and raw.readonly
    assert size == len(encoded) == raw.nbytes
    assert G.InternalKVPutRequest.FromString(raw).value == value


def test_a_small_request_is_bytes_of_exactly_the_message() -> None:
    encoded = G.InternalKVPutRequest(namespace=b"n", key=b"k", value=b"v").SerializeToString()
    body, conn = body_of(encoded, chunk=3)
    raw, size = body.take(conn, Buffered(), None, 1 << 30)  # type: ignore[arg-type]
    assert type(raw) is bytes and raw == encoded and size == len(encoded)
