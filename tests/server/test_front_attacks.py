"""The attacks of issue 18 on a real ``GcsServer``'s port (front server on), scaled down,
each beside a probe client calling InternalKVGet that must see no failed call.

Every attack here succeeded before the front server had limits: no GOAWAY for rapid reset
or floods, request bodies buffered until END_STREAM, large replies answered with GOAWAY,
unread replies held per connection only, relayed calls with odd metadata answered INTERNAL,
one log line per bad request.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import hpack
import pytest
from structlog.testing import capture_logs

from bench.port.attacks import (
    GET_ALL_NODES,
    KV_GET,
    AttackStats,
    Probe,
    RawH2,
    continuation_flood,
    empty_data_flood,
    grpc_message,
    kv_get_request,
    ping_flood,
    rapid_reset,
    request_block,
    settings_flood,
)
from gcs.proto import gcs_service_pb2
from gcs.rpc import descriptors as svc
from gcs.rpc.h2_frames import (
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    HEADERS,
    S_INITIAL_WINDOW_SIZE,
    WINDOW_UPDATE,
    frame,
)
from gcs.rpc.method_paths import method_path
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import fast_config

BOUND_S = 20.0
"""Upper bound of one attack: the fixed server closes the attacker long before."""
PROBE_TIMEOUT_S = 30.0
"""The probe's deadline per call: generous, a loaded 2-core machine must not fail it."""
TOKEN = "attack-token-0123456789"


@pytest.fixture
async def server(request: Any) -> AsyncIterator[GcsServer]:
    overrides = getattr(request, "param", {})
    async with GcsServer(fast_config(**overrides), store=MemoryStore()) as gcs:
        yield gcs


def _host_port(gcs: GcsServer) -> tuple[str, int]:
    host, port = gcs.address.rsplit(":", 1)
    return host, int(port)


async def _beside_probe(
    gcs: GcsServer, attack: Callable[[str, int, float], Awaitable[AttackStats]]
) -> AttackStats:
    host, port = _host_port(gcs)
    async with Probe(gcs.address, interval_s=0, timeout_s=PROBE_TIMEOUT_S) as probe:
        stats = await attack(host, port, time.monotonic() + BOUND_S)
    assert probe.result.failures == [], probe.result.failures[:3]
    assert probe.result.calls > 0
    return stats


async def test_rapid_reset_gets_goaway_enhance_your_calm(server: GcsServer) -> None:
    stats = await _beside_probe(
        server, lambda h, p, until: rapid_reset(h, p, until, max_connections=1)
    )
    assert stats.goaways.get(ENHANCE_YOUR_CALM) == 1, stats  # after nghttp2's 1000-reset burst
    assert stats.closed_by_server == 1


@pytest.mark.parametrize(
    "flood", [continuation_flood, ping_flood, settings_flood, empty_data_flood]
)
async def test_flood_gets_goaway_enhance_your_calm(server: GcsServer, flood: Any) -> None:
    stats = await _beside_probe(server, lambda h, p, until: flood(h, p, until, max_connections=1))
    assert stats.goaways.get(ENHANCE_YOUR_CALM) == 1, stats
    assert stats.closed_by_server == 1


def _answer(conn: RawH2, sid: int) -> dict[bytes, bytes]:
    decoder = hpack.Decoder()
    for ftype, _flags, stream, payload in conn.received:
        if ftype == HEADERS and stream == sid:
            return dict(decoder.decode(payload, raw=True))  # type: ignore[arg-type]
    raise AssertionError(f"no HEADERS on stream {sid}: {conn.received}")


async def test_a_request_declaring_too_much_is_refused_before_its_body(
    server: GcsServer,
) -> None:
    """The length prefix declares 160 MiB for GetAllNodeInfo (limit 8 MiB): answered at
    once, with the method's own message, while the body is still coming."""
    host, port = _host_port(server)
    async with Probe(server.address, interval_s=0, timeout_s=PROBE_TIMEOUT_S) as probe:
        conn = await RawH2.open(host, port)
        try:
            sid = conn.sid()
            prefix = b"\x00" + struct.pack(">I", 160 << 20)
            conn.send(
                frame(HEADERS, END_HEADERS, sid, request_block(GET_ALL_NODES))
                + frame(DATA, 0, sid, prefix + b"\x00" * 16000)
            )
            await conn.drain()
            async with asyncio.timeout(BOUND_S):
                await conn.answer_event.wait()
            answer = _answer(conn, sid)
            front = server.front
            assert front is not None
            assert sum(c.buffered_input for c in front.connections) == 0
        finally:
            await conn.close()
    assert probe.result.failures == []
    assert answer[b"grpc-status"] == b"3", answer  # INVALID_ARGUMENT, as after the whole body
    assert b"limited to 8388608 bytes" in answer[b"grpc-message"]


@pytest.mark.parametrize("server", [{"front_max_buffered_bytes": 1 << 20}], indirect=True)
async def test_a_value_larger_than_the_output_bound_is_read_back(server: GcsServer) -> None:
    """The reply is written as the client reads it, not queued whole against the
    per-connection output bound (before: GOAWAY "peer does not read its replies")."""
    value = bytes(range(256)) * (6 << 12)  # 6 MiB, > the 1 MiB per-connection bound
    options = [("grpc.max_receive_message_length", 64 << 20)]
    paths = svc.INTERNAL_KV.methods_by_name
    async with (
        Probe(server.address, interval_s=0, timeout_s=PROBE_TIMEOUT_S) as probe,
        grpc.aio.insecure_channel(server.address, options=options) as channel,
    ):
        put = channel.unary_unary(method_path(paths["InternalKVPut"]))
        get = channel.unary_unary(method_path(paths["InternalKVGet"]))
        request = gcs_service_pb2.InternalKVPutRequest(namespace=b"n", key=b"big", value=value)
        await put(request.SerializeToString(), timeout=60)
        for _ in range(2):
            raw = await get(
                gcs_service_pb2.InternalKVGetRequest(
                    namespace=b"n", key=b"big"
                ).SerializeToString(),
                timeout=60,
            )
            assert gcs_service_pb2.InternalKVGetReply.FromString(raw).value == value
    assert probe.result.failures == []


@pytest.mark.parametrize("server", [{"front_buffer_budget_bytes": 16 << 20}], indirect=True)
async def test_unread_replies_are_bounded_server_wide(server: GcsServer) -> None:
    """8 connections ask for 4 x 2 MiB each and never read (8 MiB each, under the 64 MiB
    per-connection bound): what the server holds for them stays near the server-wide
    budget; connections past it are dropped (before: 8 x 8 MiB held)."""
    paths = svc.INTERNAL_KV.methods_by_name
    async with grpc.aio.insecure_channel(server.address) as channel:
        put = channel.unary_unary(method_path(paths["InternalKVPut"]))
        request = gcs_service_pb2.InternalKVPutRequest(
            namespace=b"bench", key=b"large", value=b"v" * (2 << 20)
        )
        await put(request.SerializeToString(), timeout=60)
    front = server.front
    assert front is not None
    host, port = _host_port(server)
    block = request_block(method_path(paths["InternalKVMultiGet"]))
    body = grpc_message(
        gcs_service_pb2.InternalKVMultiGetRequest(
            namespace=b"bench", keys=[b"large"]
        ).SerializeToString()
    )
    wide_open = struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 2**31 - 1)
    attackers: list[RawH2] = []
    seen: dict[Any, Any] = {}
    peak = 0
    async with Probe(server.address, interval_s=0, timeout_s=PROBE_TIMEOUT_S) as probe:
        try:
            for _ in range(8):
                conn = await RawH2.open(host, port, wide_open, rcvbuf=4096, read=False)
                attackers.append(conn)
                out = frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65535))
                for _ in range(4):
                    sid = conn.sid()
                    out += frame(HEADERS, END_HEADERS, sid, block)
                    out += frame(DATA, END_STREAM, sid, body)
                conn.send(out)
                await conn.drain()
                local = conn.writer.get_extra_info("sockname")
                async with asyncio.timeout(BOUND_S):
                    while not _handled(front, local, seen, last_sid=7):  # noqa: ASYNC110
                        await asyncio.sleep(0)  # a loop turn, not a wait on time
                peak = max(peak, sum(c.queued_output for c in front.connections))
        finally:
            for conn in attackers:
                conn.writer.transport.abort()
                await conn.close()
    assert probe.result.failures == []
    assert peak <= (16 << 20) + (8 << 20) + 8 * (1 << 20), peak  # budget + the pass + floors


def _handled(front: Any, local: Any, seen: dict[Any, Any], last_sid: int) -> bool:
    """The server connection of the client at ``local`` is closed, or has every request up
    to ``last_sid`` answered or queued."""
    conn = seen.get(local)
    if conn is None:
        for candidate in front.connections:
            transport = candidate.transport
            if transport is not None and transport.get_extra_info("peername") == local:
                conn = seen[local] = candidate
        if conn is None:
            return False  # not accepted yet
    if conn.closed:
        return True
    if conn._last_sid < last_sid:
        return False
    return all(
        s.app is not None and s.app.task is not None and s.app.task.done()
        for s in conn.streams.values()
    )


async def _call_raw(
    host: str, port: int, path: str, extra: tuple[tuple[str, str], ...], body: bytes
) -> dict[bytes, bytes]:
    conn = await RawH2.open(host, port)
    try:
        sid = conn.sid()
        conn.send(
            frame(HEADERS, END_HEADERS, sid, request_block(path, extra))
            + frame(DATA, END_STREAM, sid, grpc_message(body))
        )
        await conn.drain()
        async with asyncio.timeout(BOUND_S):
            while not any(
                f[0] == HEADERS and f[2] == sid and f[1] & END_STREAM for f in conn.received
            ):
                assert not conn.closed.is_set(), conn.received
                conn.received_event.clear()
                await conn.received_event.wait()
        decoder = hpack.Decoder()
        out: dict[bytes, bytes] = {}
        for ftype, _flags, stream, payload in conn.received:
            if ftype == HEADERS and stream == sid:
                out.update(dict(decoder.decode(payload, raw=True)))  # type: ignore[arg-type]
        return out
    finally:
        await conn.close()


KV_GET_BODY = kv_get_request(b"n", b"k")
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
ODD_METADATA = {
    "upper-case name": (("X-Odd", "v"),),
    "tab in a value": (("x-odd", "a\tb"),),
    "NUL in a value": (("x-odd", "a\x00b"),),
    "bad -bin value": (("x-odd-bin", "!!!"),),
}


@pytest.mark.parametrize("case", sorted(ODD_METADATA))
async def test_odd_metadata_on_relayed_paths_is_never_internal(
    server: GcsServer, case: str
) -> None:
    """Before: relayed to grpc.aio, such metadata made its client refuse the call with
    INTERNAL "Invalid metadata"; native methods ignore it."""
    host, port = _host_port(server)
    extra = ODD_METADATA[case]
    native = await _call_raw(host, port, KV_GET, extra, KV_GET_BODY)
    relayed = await _call_raw(host, port, REFLECTION, extra, b"\x3a\x00")  # list_services
    unknown = await _call_raw(host, port, "/no.Such/Method", extra, b"")
    assert native[b"grpc-status"] == b"0"
    assert relayed[b"grpc-status"] == b"0", relayed
    assert unknown[b"grpc-status"] == b"12", unknown  # UNIMPLEMENTED, not INTERNAL


async def test_odd_authorization_is_unauthenticated_on_every_path(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """Token mode: an upper-case ``Authorization`` name or a tab in its value is no token,
    on native and relayed paths alike (before: INTERNAL on relayed ones)."""
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_USE_TLS"):
        monkeypatch.delenv(var, raising=False)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    config = fast_config(auth_mode="token", auth_token_path=str(token))
    async with GcsServer(config, store=MemoryStore()) as gcs:
        host, port = _host_port(gcs)
        for extra in (
            (("Authorization", f"Bearer {TOKEN}"),),
            (("authorization", f"Bearer\t{TOKEN}"),),
        ):
            native = await _call_raw(host, port, KV_GET, extra, KV_GET_BODY)
            relayed = await _call_raw(host, port, REFLECTION, extra, b"\x3a\x00")
            assert native[b"grpc-status"] == relayed[b"grpc-status"] == b"16", (native, relayed)
        good = (("authorization", f"Bearer {TOKEN}"),)
        assert (await _call_raw(host, port, REFLECTION, good, b"\x3a\x00"))[b"grpc-status"] == b"0"


async def test_bad_requests_are_counted_and_sampled_in_the_log(server: GcsServer) -> None:
    """50 undecodable requests: 50 counted in gcs_rpc_warnings_total, a handful of log
    lines (before: one line each)."""
    path = method_path(svc.INTERNAL_KV.methods_by_name["InternalKVGet"])
    with capture_logs() as logs:
        async with grpc.aio.insecure_channel(server.address) as channel:
            call = channel.unary_unary(path)
            for _ in range(50):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(b"\x0a\x64", timeout=10)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    lines = [e for e in logs if e.get("event") == "rpc.undecodable_request"]
    assert 1 <= len(lines) <= 11, len(lines)
    counted = {
        s.labels["event"]: s.value
        for family in server.metrics.registry.collect()
        if family.name == "gcs_rpc_warnings"
        for s in family.samples
        if s.name == "gcs_rpc_warnings_total"
    }
    assert counted["rpc.undecodable_request"] == 50
