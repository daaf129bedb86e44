"""HTTP/2 frame and HPACK-literal encoding shared by our hand-rolled client and server.

Only what both sides need: frame type/flag/setting/error constants, a frame header
packer, and HPACK *literal without indexing* encoders.  Neither side ever inserts into the
peer's dynamic table, so the blocks built here are stateless (and can be built once and
reused on any connection).
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
# flags
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# settings ids
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 1, 2, 3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 4, 5, 6
# error codes (RFC 9113 section 7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
MAX_FRAME_SIZE = 16384
"""The RFC's default SETTINGS_MAX_FRAME_SIZE; we never raise ours."""

FRAME_HEADER = struct.Struct(">IBI")  # (24-bit length << 8 | type), flags, stream id


def frame_header(length: int, ftype: int, flags: int, stream_id: int) -> bytes:
    return FRAME_HEADER.pack((length << 8) | ftype, flags, stream_id)


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return frame_header(len(payload), ftype, flags, stream_id) + payload


def hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_str(value: bytes) -> bytes:
    return hpack_int(len(value), 7, 0x00) + value


def literal(name_index: int, value: str | bytes) -> bytes:
    """Literal header field without indexing, name from the static table."""
    raw = value.encode() if isinstance(value, str) else value
    return hpack_int(name_index, 4, 0x00) + hpack_str(raw)


def literal_new(name: str | bytes, value: str | bytes) -> bytes:
    """Literal header field without indexing, new name."""
    raw_name = name.encode() if isinstance(name, str) else name
    raw = value.encode() if isinstance(value, str) else value
    return b"\x00" + hpack_str(raw_name) + hpack_str(raw)
