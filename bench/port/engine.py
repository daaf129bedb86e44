"""Which HTTP/2 engine under the front server's framing: our ``gcs.front.h2`` or
libnghttp2 through the ``ngh2`` package (alpha), on the two shapes the front server lives on.

    pip install ngh2   # into a scratch virtualenv; it is not a dependency of gcs
    PYTHONPATH=<gcs venv site-packages> <scratch venv>/bin/python -m bench.port.engine

* ``unary``: 2,000 unary calls on one connection, as a grpc C-core client sends them
  (HPACK with indexing, so repeated calls are all-indexed blocks), each answered at once with
  HEADERS + one small DATA + trailers; CPU per call, bytes in -> bytes out.
* ``fan-out``: 2,000 held polls on one connection answered with one shared 300-byte
  message (a publish);
* ``fan-out/conn``: the same with one connection per poll, as subscribers have (the cost
  of reaching each connection's engine and writing its bytes counts).

Both engines get the same client bytes and produce replies with the same headers; only
the server side is timed (``time.process_time``), best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import hpack  # noqa: E402

from gcs.front.grpc_framing import OK_TRAILERS, RESPONSE_HEADERS  # noqa: E402
from gcs.front.h2 import H2Limits, H2ServerConnection, Stream  # noqa: E402
from gcs.rpc.h2_frames import DATA, END_HEADERS, END_STREAM, HEADERS, PREFACE, SETTINGS, frame  # noqa: E402

PATH = "/ray.rpc.InternalKVGcsService/InternalKVGet"
REQUEST = b"\x00\x00\x00\x00\x0c" + b"\x0a\x05probe\x12\x05bench"
REPLY = b"\x00\x00\x00\x00\x04" + b"\x0a\x02\x08\x00"
PUBLISH = b"\x00" + (300).to_bytes(4) + b"p" * 300


def client_bytes(calls: int, *, end_with_data: bool = True) -> bytes:
    enc = hpack.Encoder()
    out = bytearray(PREFACE + frame(SETTINGS, 0, 0))
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PATH),
        (":authority", "127.0.0.1:6379"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-accept-encoding", "identity,deflate,gzip"),
        ("user-agent", "grpc-c/45.0.0 (linux; chttp2)"),
    ]
    for i in range(calls):
        sid = 2 * i + 1
        out += frame(HEADERS, END_HEADERS, sid, enc.encode(headers))
        out += frame(DATA, END_STREAM if end_with_data else 0, sid, REQUEST)
    return bytes(out)


class _Sink(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.size = 0

    def write(self, data: Any) -> None:
        self.size += len(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


class _Unary:
    def __init__(self, hold: bool) -> None:
        self.hold = hold
        self.held: list[Stream] = []

    def on_request(self, conn: H2ServerConnection, stream: Stream) -> None:
        pass

    def on_data(self, conn: H2ServerConnection, stream: Stream, data: bytes) -> None:
        conn.release(stream, len(data))

    def on_end(self, conn: H2ServerConnection, stream: Stream) -> None:
        if self.hold:
            self.held.append(stream)
        else:
            conn.send_reply(stream, RESPONSE_HEADERS, REPLY, OK_TRAILERS)

    def on_reset(self, conn: H2ServerConnection, stream: Stream) -> None:
        pass


def ours(data: bytes, *, fan_out: bool) -> tuple[float, int]:
    return asyncio.run(_ours(data, fan_out=fan_out))


async def _ours(data: bytes, *, fan_out: bool) -> tuple[float, int]:
    app = _Unary(hold=fan_out)
    limits = H2Limits(max_concurrent_streams=1 << 20)
    conn = H2ServerConnection(app, limits)
    sink = _Sink()
    start = time.process_time()
    conn.connection_made(sink)
    conn.data_received(data)
    while conn._parse_deferred:  # noqa: ASYNC110 - parsed 512 frames per loop turn
        await asyncio.sleep(0)
    if fan_out:
        conn.cork()
        for stream in app.held:
            conn.send_reply(stream, RESPONSE_HEADERS, PUBLISH, OK_TRAILERS, counted=False)
        conn.uncork()
    return time.process_time() - start, sink.size


def nghttp2(data: bytes, *, fan_out: bool) -> tuple[float, int]:
    import ngh2
    from ngh2 import events as ev

    config = ngh2.Configuration(peer_max_concurrent_streams=1 << 20)
    response = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    trailers = [(b"grpc-status", b"0")]
    start = time.process_time()
    conn = ngh2.Connection(ngh2.Role.SERVER, config)
    conn.initiate_connection({ngh2.Setting.MAX_CONCURRENT_STREAMS: 1 << 20})
    conn.receive_data(data)
    held = []
    for event in conn.events():
        if isinstance(event, ev.DataReceived) and event.end_stream:
            if fan_out:
                held.append(event.stream_id)
            else:
                conn.send_response(event.stream_id, response)
                conn.send_data(event.stream_id, REPLY)
                conn.send_trailers(event.stream_id, trailers)
    for sid in held:
        conn.send_response(sid, response)
        conn.send_data(sid, PUBLISH)
        conn.send_trailers(sid, trailers)
    size = len(conn.data_to_send())
    return time.process_time() - start, size


def ours_per_connection(data_one: bytes, polls: int) -> tuple[float, int]:
    return asyncio.run(_ours_per_connection(data_one, polls))


async def _ours_per_connection(data_one: bytes, polls: int) -> tuple[float, int]:
    apps = [_Unary(hold=True) for _ in range(polls)]
    conns = [H2ServerConnection(app, H2Limits()) for app in apps]
    sinks = [_Sink() for _ in range(polls)]
    for conn, sink in zip(conns, sinks, strict=True):
        conn.connection_made(sink)
        conn.data_received(data_one)
    start = time.process_time()
    for conn, app in zip(conns, apps, strict=True):
        for stream in app.held:
            conn.send_reply(stream, RESPONSE_HEADERS, PUBLISH, OK_TRAILERS, counted=False)
    return time.process_time() - start, sum(s.size for s in sinks)


def nghttp2_per_connection(data_one: bytes, polls: int) -> tuple[float, int]:
    import ngh2
    from ngh2 import events as ev

    response = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    trailers = [(b"grpc-status", b"0")]
    conns, held = [], []
    for _ in range(polls):
        conn = ngh2.Connection(ngh2.Role.SERVER)
        conn.initiate_connection()
        conn.receive_data(data_one)
        for event in conn.events():
            if isinstance(event, ev.DataReceived) and event.end_stream:
                held.append(event.stream_id)
        conn.data_to_send()
        conns.append(conn)
    start = time.process_time()
    size = 0
    for conn, sid in zip(conns, held, strict=True):
        conn.send_response(sid, response)
        conn.send_data(sid, PUBLISH)
        conn.send_trailers(sid, trailers)
        size += len(conn.data_to_send())
    return time.process_time() - start, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    try:
        import ngh2  # noqa: F401
    except ImportError:
        raise SystemExit("ngh2 is not installed here (see the module docstring)") from None
    data = client_bytes(args.calls)
    for shape, fan_out in (("unary", False), ("fan-out", True)):
        for name, engine in (("ours", ours), ("ngh2", nghttp2)):
            runs = [engine(data, fan_out=fan_out) for _ in range(args.repeat)]
            best = min(cpu for cpu, _ in runs)
            out = runs[0][1]
            print(
                f"{shape:12} {name:5} {1e6 * best / args.calls:6.2f} us/call "
                f"(best of {args.repeat}, {args.calls} calls, {out} bytes out)"
            )
    one = client_bytes(1)
    for name, per_conn in (("ours", ours_per_connection), ("ngh2", nghttp2_per_connection)):
        runs = [per_conn(one, args.calls) for _ in range(args.repeat)]
        best = min(cpu for cpu, _ in runs)
        print(
            f"{'fan-out/conn':12} {name:5} {1e6 * best / args.calls:6.2f} us/poll "
            f"(best of {args.repeat}, {args.calls} connections, {runs[0][1]} bytes out)"
        )


if __name__ == "__main__":
    main()
