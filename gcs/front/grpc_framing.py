"""gRPC over HTTP/2 (the PROTOCOL-HTTP2 spec) for the front server: header blocks, message
framing, metadata and timeouts.  Pure functions; header blocks are HPACK literals without
indexing (:mod:`gcs.rpc.h2_frames`), so they are valid on any connection and cacheable.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
import zlib
from collections.abc import Iterable, Sequence

import grpc

from gcs.rpc.h2_frames import literal, literal_new

Header = tuple[bytes, bytes]
Metadata = tuple[tuple[str, str | bytes], ...]

RESPONSE_HEADERS = b"\x88" + literal(31, "application/grpc")  # :status 200, content-type
"""Response HEADERS without metadata (static table: 8 = :status 200, 31 = content-type)."""
OK_TRAILERS = literal_new("grpc-status", "0")
STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""The one ``grpc-`` trailer a handler may set: the status's binary error details."""
_RESERVED = (b":", b"grpc-", b"content-type", b"te", b"user-agent", b"host", b"connection")
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_BAD_KEY = re.compile(rb"[^0-9a-z_.\-]")
_BAD_VALUE = re.compile(rb"[^\x20-\x7e]")
_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if c != ord("%"))


class GrpcWireError(Exception):
    """A request that is not valid gRPC; ``code`` is the status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def message_prefix(size: int) -> bytes:
    """The 5-byte length prefix of an uncompressed message of ``size`` bytes."""
    return b"\x00" + size.to_bytes(4)


def message_frame(message: bytes) -> bytes:
    """The 5-byte length prefix (uncompressed) + the message."""
    return b"\x00" + len(message).to_bytes(4) + message


def split_messages(
    buf: bytearray, encoding: bytes | None, max_bytes: int
) -> list[tuple[bytes, int]]:
    """Complete length-prefixed messages at the front of ``buf`` (removed from it), each with
    the bytes it took on the wire; compressed ones are inflated (gzip / deflate)."""
    out: list[tuple[bytes, int]] = []
    while len(buf) >= 5:
        length = int.from_bytes(buf[1:5])
        if length > max_bytes:
            raise GrpcWireError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"received message larger than max ({length} vs. {max_bytes})",
            )
        if len(buf) < 5 + length:
            break
        flag = buf[0]
        raw = bytes(buf[5 : 5 + length])
        del buf[: 5 + length]
        out.append((inflate(raw, encoding, max_bytes) if flag else raw, 5 + length))
    return out


def inflate(data: bytes | memoryview, encoding: bytes | None, max_bytes: int) -> bytes:
    if encoding == b"gzip":
        wbits = 31
    elif encoding == b"deflate":
        wbits = 15
    else:
        raise GrpcWireError(
            grpc.StatusCode.UNIMPLEMENTED,
            f"compressed message with grpc-encoding {encoding!r} is not supported",
        )
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as err:
        raise GrpcWireError(grpc.StatusCode.INTERNAL, f"cannot decompress: {err}") from None
    if len(out) > max_bytes:
        raise GrpcWireError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"decompressed message larger than {max_bytes}"
        )
    return out


def parse_timeout(value: bytes) -> float:
    """``grpc-timeout`` (at most 8 digits and a unit) in seconds."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        raise GrpcWireError(grpc.StatusCode.INTERNAL, f"malformed grpc-timeout {value!r}")
    return int(digits) * unit


def request_metadata(headers: Iterable[Header]) -> Metadata:
    """Client metadata to pass on (``-bin`` values base64-decoded, reserved headers left
    out).  Entries gRPC could not carry are dropped, as the methods served here ignore
    them: a key that is not lower-case ``[0-9a-z_.-]``, a text value with a byte outside
    printable ASCII (tab, NUL...), a ``-bin`` value that is not base64.  (Relayed to
    grpc.aio as they are, they made its client refuse the call with INTERNAL "Invalid
    metadata".)"""
    out: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name.startswith(_RESERVED) or _BAD_KEY.search(name) or not name:
            continue
        key = name.decode("ascii")
        if key.endswith("-bin"):
            decoded = _b64decode(value)
            if decoded is not None:
                out.append((key, decoded))
        elif not _BAD_VALUE.search(value):
            out.append((key, value.decode("ascii")))
    return tuple(out)


def _b64decode(value: bytes) -> bytes | None:
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
    except ValueError:
        return None


def metadata_block(metadata: Sequence[tuple[str, str | bytes]] | None) -> bytes:
    parts = []
    for key, value in metadata or ():
        reserved = key.startswith(("grpc-", ":")) and key != STATUS_DETAILS_KEY
        if reserved or key in ("content-type", "te"):
            continue
        if isinstance(value, bytes):
            raw = base64.b64encode(value).rstrip(b"=") if key.endswith("-bin") else value
        else:
            raw = value.encode()
        parts.append(literal_new(key.lower(), raw))
    return b"".join(parts)


def trailers_block(
    code: grpc.StatusCode, message: str = "", metadata: Sequence[tuple[str, str | bytes]] = ()
) -> bytes:
    if code is grpc.StatusCode.OK and not message and not metadata:
        return OK_TRAILERS
    block = literal_new("grpc-status", str(code.value[0]))
    if message:
        block += literal_new("grpc-message", urllib.parse.quote(message, safe=_SAFE))
    return block + metadata_block(metadata)


def trailers_only(
    code: grpc.StatusCode, message: str = "", metadata: Sequence[tuple[str, str | bytes]] = ()
) -> bytes:
    """A whole error answer in one HEADERS (END_STREAM)."""
    return RESPONSE_HEADERS + trailers_block(code, message, metadata)
