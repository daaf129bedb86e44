"""A planned handover's hand-off (issue 29): the old leader stops listening before it tells
its clients to go away, so no reconnect can reach it (a connection caught in its closing
listener would be reset, and gRPC would wait out its reconnect backoff, about a second)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from gcs.rpc.h2_frames import GOAWAY
from gcs.server import GcsServer

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")  # + SETTINGS


async def test_after_its_goaway_the_old_leader_accepts_no_connection(
    gcs_server: GcsServer,
) -> None:
    host, port = gcs_server.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(PREFACE)
    await writer.drain()
    rpc = gcs_server.wiring.rpc if gcs_server.wiring is not None else None
    assert rpc is not None and rpc.front is not None
    rpc.hold()
    rpc.hand_off()
    seen = b""
    async with asyncio.timeout(10):
        while GOAWAY not in _frame_types(seen):
            chunk = await reader.read(65536)
            assert chunk, "closed without a GOAWAY"
            seen += chunk
    # the client has its GOAWAY: a reconnect now finds no listener here (on a shared
    # port, the successor's)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5).close()
    writer.close()


def _frame_types(data: bytes) -> list[int]:
    types, pos = [], 0
    while pos + 9 <= len(data):
        types.append(data[pos + 3])
        pos += 9 + int.from_bytes(data[pos : pos + 3])
    return types
