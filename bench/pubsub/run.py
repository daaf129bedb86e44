"""Publish-to-last-subscriber latency with many long-poll subscribers over loopback gRPC.

    python bench/pubsub/run.py [--subscribers 2000] [--publishes 20] [--client-procs 4]
                               [--subs-per-channel 1] [--server-option KEY=VALUE ...]

A server process hosts the pubsub services (with ``LONG_POLL_SERVER_OPTIONS``; set
``BENCH_PENDING_CAP=default`` to see gRPC's stock 1,000-pending-call cap).  Client processes
host raylet-cheap subscribers: raw ``unary_unary`` with spliced request bytes, one
long-lived coroutine each, one parse per distinct reply, ``--subs-per-channel``
subscribers per HTTP/2 connection (1 = one connection each, as separate raylets).  Once
every subscriber holds a poll the server publishes one message (send time in
``node_name``), waits until every subscriber polls again, and repeats.

Reports, per publish: end-to-end latency (last subscriber's receive time minus send
time, same host clock), server-side latency (publish -> last poll handler returned its
reply to gRPC), the publisher's CPU per ``publish()``, the server process CPU (all
threads, gRPC included) and the client processes' CPU, each also per RPC event /
per subscriber.  Target: p99 <= 200 ms at 2,000 subscribers.  Bounded by --budget-s.
The machine's load matters: compare runs made back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _quiet_logs() -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def server_main(
    conn: Connection, subscribers: int, publishes: int, budget_s: float, profile: bool
) -> None:
    _quiet_logs()
    if not profile:
        asyncio.run(_server(conn, subscribers, publishes, budget_s))
        return
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.runcall(asyncio.run, _server(conn, subscribers, publishes, budget_s))
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


async def _server(conn: Connection, subscribers: int, publishes: int, budget_s: float) -> None:
    import grpc

    from gcs.base.clock import SystemClock
    from gcs.managers.pubsub import GCS_NODE_INFO_CHANNEL
    from gcs.proto import gcs_pb2
    from gcs.services.pubsub_runtime import GcsPubSub

    pubsub = GcsPubSub.create(SystemClock())
    from gcs.rpc.server import LONG_POLL_SERVER_OPTIONS

    options: list[tuple[str, int | str]] = [("grpc.max_concurrent_streams", 100_000)]
    if os.environ.get("BENCH_PENDING_CAP") != "default":  # for before/after comparisons
        options = list(LONG_POLL_SERVER_OPTIONS)
    for item in filter(None, os.environ.get("BENCH_SERVER_OPTIONS", "").split(",")):
        key, _, value = item.partition("=")
        options.append((key, int(value) if value.lstrip("-").isdigit() else value))
    server = grpc.aio.server(options=options)
    last_reply = [0.0]

    def on_call(path: str, code: str, seconds: float) -> None:
        if path.endswith("/GcsSubscriberPoll"):
            last_reply[0] = time.perf_counter()

    server.add_generic_rpc_handlers(pubsub.handlers(on_call=on_call))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    conn.send(port)
    pub = pubsub.control_plane
    result: dict[str, object] = {}
    try:
        async with asyncio.timeout(budget_s):
            await _all_polling(pub, subscribers)
            publish_cpu: list[float] = []
            drain_s: list[float] = []
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for i in range(publishes):
                info = gcs_pb2.GcsNodeInfo(node_id=b"n" * 28, node_name=str(time.time_ns()))
                c, t = time.process_time(), time.perf_counter()
                pub.publish(GCS_NODE_INFO_CHANNEL, info.node_id, info)
                publish_cpu.append(time.process_time() - c)
                if i < publishes - 1:  # after the last one clients close instead
                    await _all_polling(pub, subscribers)
                    drain_s.append(last_reply[0] - t)
                    await asyncio.sleep(0.02)
            result = {
                "publish_cpu_s": publish_cpu,
                "drain_s": drain_s,
                "server_cpu_s": time.process_time() - cpu0,
                "wall_s": time.perf_counter() - wall0,
            }
    except TimeoutError:
        result = {"error": f"timed out; stats={pub.stats()}"}
    conn.send(result)
    await asyncio.sleep(0.5)
    await pubsub.stop()
    await server.stop(grace=None)


async def _all_polling(pub, subscribers: int) -> None:  # type: ignore[no-untyped-def]
    while pub.held_poll_count() < subscribers:  # noqa: ASYNC110 - polling a counter
        await asyncio.sleep(0.01)


def client_main(
    conn: Connection,
    port: int,
    subscribers: int,
    publishes: int,
    budget_s: float,
    subs_per_channel: int,
    first_index: int,
) -> None:
    _quiet_logs()
    asyncio.run(
        _client(conn, port, subscribers, publishes, budget_s, subs_per_channel, first_index)
    )


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if not n:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


_POLL_PATH = "/ray.rpc.ControlPlanePubSubGcsService/GcsSubscriberPoll"
_COMMAND_PATH = "/ray.rpc.ControlPlanePubSubGcsService/GcsSubscriberCommandBatch"


async def _client(
    conn: Connection,
    port: int,
    subscribers: int,
    publishes: int,
    budget_s: float,
    subs_per_channel: int,
    first_index: int,
) -> None:
    """Raylet-cheap subscribers: raw bytes in and out, one long-lived coroutine each.

    The poll request is spliced from cached parts; a reply is parsed once per distinct
    reply (every subscriber of a publish gets the same bytes), standing in for the
    microsecond C++ parse a raylet does.
    """
    import grpc

    from gcs.managers.pubsub import GCS_NODE_INFO_CHANNEL
    from gcs.managers.pubsub.publisher import NIL_PUBLISHER_ID
    from gcs.proto import gcs_service_pb2

    addr = f"127.0.0.1:{port}"
    n_channels = max(1, -(-subscribers // subs_per_channel))
    channels = [
        grpc.aio.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(n_channels)
    ]
    polls = [ch.unary_unary(_POLL_PATH) for ch in channels]
    commands = [ch.unary_unary(_COMMAND_PATH) for ch in channels]
    latest: dict[int, int] = {}  # sequence id -> latest receive time (ns) in this process
    sent: dict[int, int] = {}
    parsed: dict[bytes, tuple[bytes, int]] = {}  # reply bytes -> (publisher id, max seq)
    remaining = [subscribers]
    done = asyncio.Event()

    def parse(reply: bytes) -> tuple[bytes, int]:
        msg = gcs_service_pb2.GcsSubscriberPollReply.FromString(reply)
        top = 0
        for m in msg.pub_messages:
            top = max(top, m.sequence_id)
            sent[m.sequence_id] = int(m.node_info_message.node_name)
        return msg.publisher_id, top

    async def subscriber(i: int) -> None:
        sid = (first_index + i).to_bytes(28, "big")
        poll = polls[i % n_channels]
        head = b"\x0a\x1c" + sid
        pid_part = b"\x1a\x1c" + NIL_PUBLISHER_ID
        seq_part = b""
        got = 0
        while got < publishes:
            reply = await poll(head + seq_part + pid_part)
            now = time.time_ns()
            info = parsed.get(reply)
            if info is None:
                info = parsed[reply] = parse(reply)
            pid, top = info
            if top:
                got += 1
                if latest.get(top, 0) < now:
                    latest[top] = now
                seq_part = b"\x10" + _varint(top)
            pid_part = b"\x1a\x1c" + pid
        remaining[0] -= 1
        if not remaining[0]:
            done.set()

    def command(i: int) -> bytes:
        req = gcs_service_pb2.GcsSubscriberCommandBatchRequest(
            subscriber_id=(first_index + i).to_bytes(28, "big")
        )
        req.commands.add(channel_type=GCS_NODE_INFO_CHANNEL).subscribe_message.SetInParent()
        return req.SerializeToString()

    try:
        async with asyncio.timeout(budget_s):
            for k in range(0, n_channels, 50):  # connect gently: the listen backlog is finite
                await asyncio.gather(*(ch.channel_ready() for ch in channels[k : k + 50]))
            for k in range(0, subscribers, 200):  # gentle: 200 CommandBatch RPCs at a time
                await asyncio.gather(
                    *(
                        commands[i % n_channels](command(i), wait_for_ready=True)
                        for i in range(k, min(subscribers, k + 200))
                    )
                )
            cpu0 = time.process_time()
            tasks = [asyncio.create_task(subscriber(i)) for i in range(subscribers)]
            await done.wait()
            cpu = time.process_time() - cpu0
            for t in tasks:
                await t
        conn.send(
            {
                "latency": {seq: (latest[seq] - sent[seq]) / 1e9 for seq in latest},
                "cpu_s": cpu,
            }
        )
    except TimeoutError:
        conn.send({"error": f"client timed out; {remaining[0]} subscribers unfinished"})
    finally:
        for ch in channels:
            await ch.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=2000)
    parser.add_argument("--publishes", type=int, default=20)
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument(
        "--subs-per-channel",
        type=int,
        default=1,
        help="subscribers sharing one HTTP/2 connection (1: one per subscriber, as raylets)",
    )
    parser.add_argument("--budget-s", type=float, default=50.0)
    parser.add_argument("--profile", action="store_true", help="cProfile the server")
    parser.add_argument(
        "--server-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra grpc server channel argument, e.g. grpc.optimization_target=throughput",
    )
    args = parser.parse_args()
    os.environ["BENCH_SERVER_OPTIONS"] = ",".join(args.server_option)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # no GOAWAY chatter at shutdown
    ctx = mp.get_context("spawn")
    srv_parent, srv_child = ctx.Pipe()
    server = ctx.Process(
        target=server_main,
        args=(srv_child, args.subscribers, args.publishes, args.budget_s, args.profile),
    )
    server.start()
    port = srv_parent.recv()
    per = args.subscribers // args.client_procs
    clients = []
    for k in range(args.client_procs):
        n = per if k < args.client_procs - 1 else args.subscribers - per * k
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=client_main,
            args=(
                child,
                port,
                n,
                args.publishes,
                args.budget_s,
                args.subs_per_channel,
                k * per + 1,
            ),
        )
        proc.start()
        clients.append((proc, parent))
    srv = srv_parent.recv()
    per_seq: dict[int, float] = {}
    client_cpu = 0.0
    for proc, parent in clients:
        got = parent.recv() if parent.poll(args.budget_s + 5) else {"error": "no reply"}
        proc.join(10)
        if "error" in got:
            print("client:", got["error"])
            continue
        client_cpu += got["cpu_s"]
        for seq, lat in got["latency"].items():
            per_seq[seq] = max(per_seq.get(seq, 0.0), lat)
    server.join(10)
    if "error" in srv:
        print("server:", srv["error"])
        sys.exit(1)
    if not per_seq:
        sys.exit(1)
    lat_ms = [v * 1000 for v in per_seq.values()]
    pub_us = [v * 1e6 for v in srv["publish_cpu_s"]]  # type: ignore[union-attr]
    n_pub = len(lat_ms)
    print(
        f"subscribers={args.subscribers} publishes={n_pub} client_procs={args.client_procs} "
        f"subs_per_channel={args.subs_per_channel}"
    )
    print(
        f"end to end, publish -> last subscriber received ms: p50={pct(lat_ms, 0.5):.1f} "
        f"p99={pct(lat_ms, 0.99):.1f} max={max(lat_ms):.1f} mean={statistics.mean(lat_ms):.1f}"
    )
    drain_ms = [v * 1000 for v in srv["drain_s"]]  # type: ignore[union-attr]
    if drain_ms:
        print(
            f"server side, publish -> last poll reply handed to gRPC ms: "
            f"p50={pct(drain_ms, 0.5):.1f} p99={pct(drain_ms, 0.99):.1f}"
        )
    print(
        f"publisher CPU per publish() call: p50={pct(pub_us, 0.5) / 1000:.2f} ms "
        f"max={max(pub_us) / 1000:.2f} ms"
    )
    server_cpu = float(srv["server_cpu_s"])  # type: ignore[arg-type]
    events = 2 * args.subscribers
    print(
        f"server process CPU (publish + {args.subscribers} replies + re-polls): "
        f"{server_cpu / n_pub * 1000:.1f} ms per publish = "
        f"{server_cpu / n_pub / events * 1e6:.0f} us per RPC event ({events} per publish)"
    )
    print(
        f"client processes CPU, all {args.client_procs}: {client_cpu / n_pub * 1000:.1f} ms "
        f"per publish = {client_cpu / n_pub / args.subscribers * 1e6:.0f} us per "
        f"subscriber per publish"
    )


if __name__ == "__main__":
    main()
