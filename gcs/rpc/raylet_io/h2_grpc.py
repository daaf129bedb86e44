"""What a unary gRPC call says in HTTP/2 header blocks, for the lean client (``h2_unary``).

The request's constant header block and its ``grpc-timeout``, and the reply's outcome read
from its headers/trailers and body (gRPC's status, or its HTTP-to-status mapping when a proxy
answered), as ``bytes`` or an :class:`H2CallError` carrying a ``grpc.StatusCode``.
"""

from __future__ import annotations

import urllib.parse

import grpc

from gcs.rpc.h2_frames import literal as _literal
from gcs.rpc.h2_frames import literal_new as _literal_new

_STATUS_BY_CODE = {s.value[0]: s for s in grpc.StatusCode}


class H2CallError(Exception):
    """A failed call; ``code`` is the gRPC status (``UNAVAILABLE`` for transport failures)."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self.details = details

    def code(self) -> grpc.StatusCode:
        return self._code


def encode_request_headers(path: str, authority: str, authorization: str = "") -> bytes:
    """The constant part of the request header block (grpc-timeout appended per call);
    ``authorization`` (Ray's ``Bearer <token>``) is sent when given."""
    auth = _literal(23, authorization) if authorization else b""  # authorization (static 23)
    return (
        b"\x83"  # :method POST (static 3)
        + b"\x86"  # :scheme http (static 6)
        + _literal(4, path)  # :path
        + _literal(1, authority)  # :authority (pseudo-headers first: RFC 9113 8.3)
        + _literal(31, "application/grpc")  # content-type
        + _literal_new("te", "trailers")
        + auth
    )


def grpc_timeout_value(timeout_s: float) -> str:
    """``grpc-timeout`` in milliseconds (at most 8 digits, as the spec requires)."""
    ms = max(1, int(timeout_s * 1000 + 0.999))
    if ms < 100_000_000:
        return f"{ms}m"
    return f"{min(ms // 1000, 99_999_999)}S"


def http_status_error(status: str) -> H2CallError:
    # gRPC's HTTP-to-status mapping (doc/http-grpc-status-mapping.md)
    code = {
        "400": grpc.StatusCode.INTERNAL,
        "401": grpc.StatusCode.UNAUTHENTICATED,
        "403": grpc.StatusCode.PERMISSION_DENIED,
        "404": grpc.StatusCode.UNIMPLEMENTED,
        "429": grpc.StatusCode.UNAVAILABLE,
        "502": grpc.StatusCode.UNAVAILABLE,
        "503": grpc.StatusCode.UNAVAILABLE,
        "504": grpc.StatusCode.UNAVAILABLE,
    }.get(status, grpc.StatusCode.UNKNOWN)
    return H2CallError(code, f"HTTP status {status or 'missing'}")


def trailers_result(headers: list[tuple[str, str]], body: bytearray) -> bytes | H2CallError:
    status_text = None
    message = ""
    http_status = None
    for name, value in headers:
        if name == "grpc-status":
            status_text = value
        elif name == "grpc-message":
            message = urllib.parse.unquote(value)
        elif name == ":status":
            http_status = value
    if status_text is None:
        if http_status is not None and http_status != "200":
            return http_status_error(http_status)
        return H2CallError(grpc.StatusCode.INTERNAL, "response without grpc-status")
    try:
        code = _STATUS_BY_CODE.get(int(status_text), grpc.StatusCode.UNKNOWN)
    except ValueError:
        code = grpc.StatusCode.UNKNOWN
    if code is not grpc.StatusCode.OK:
        return H2CallError(code, message)
    if len(body) < 5:
        return H2CallError(grpc.StatusCode.INTERNAL, "OK status without a message")
    if body[0] != 0:
        return H2CallError(grpc.StatusCode.INTERNAL, "compressed reply not requested")
    length = int.from_bytes(body[1:5])
    if len(body) != 5 + length:
        return H2CallError(grpc.StatusCode.INTERNAL, "reply is not exactly one message")
    return bytes(body[5:])
