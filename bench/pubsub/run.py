"""Publish-to-last-subscriber latency with many long-poll subscribers over loopback gRPC.

    python bench/pubsub/run.py [--subscribers 2000] [--publishes 20] [--client-procs 2]

A server process hosts the pubsub services; client processes run ``GcsSubscriber``s spread
over several channels, all subscribed to GCS_NODE_INFO.  Once every subscriber holds a
poll, the server publishes one message (its send time in ``node_name``), waits until every
subscriber polls again, and repeats.  Latency of a publish = last subscriber's receive time
minus the send time (same host clock).  Reports p50/p99/max over the publishes, the
publisher's CPU per ``publish()`` call and the server's CPU per publish (gRPC included).
Target: p99 <= 200 ms at 2,000 subscribers.  Bounded: gives up after --budget-s seconds.
Compare runs by re-running with the same arguments; the machine's load matters.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
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

    from gcs.clock import SystemClock
    from gcs.proto import gcs_pb2
    from gcs.pubsub import GCS_NODE_INFO_CHANNEL
    from gcs.pubsub.runtime import GcsPubSub

    pubsub = GcsPubSub.create(SystemClock())
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 100_000)])
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
    conn: Connection, port: int, subscribers: int, publishes: int, budget_s: float
) -> None:
    _quiet_logs()
    asyncio.run(_client(conn, port, subscribers, publishes, budget_s))


async def _client(
    conn: Connection, port: int, subscribers: int, publishes: int, budget_s: float
) -> None:
    import grpc

    from gcs.pubsub import GCS_NODE_INFO_CHANNEL
    from gcs.pubsub.subscriber import GcsSubscriber

    channels = [
        grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(max(1, subscribers // 100))
    ]
    latest: dict[int, int] = {}  # sequence id -> latest receive time (ns) in this process
    sent: dict[int, int] = {}
    done = asyncio.Event()
    counts = [0] * subscribers

    def make_cb(i: int):  # type: ignore[no-untyped-def]
        def cb(msg) -> None:  # type: ignore[no-untyped-def]
            now = time.time_ns()
            seq = msg.sequence_id
            sent[seq] = int(msg.node_info_message.node_name)
            latest[seq] = max(latest.get(seq, 0), now)
            counts[i] += 1
            if counts[i] == publishes and all(c >= publishes for c in counts):
                done.set()

        return cb

    subs = [
        GcsSubscriber(channels[i % len(channels)], on_message=make_cb(i))
        for i in range(subscribers)
    ]
    try:
        async with asyncio.timeout(budget_s):
            for k in range(0, len(subs), 200):  # gentle: 200 CommandBatch RPCs at a time
                await asyncio.gather(
                    *(s.subscribe(GCS_NODE_INFO_CHANNEL) for s in subs[k : k + 200])
                )
            for s in subs:
                await s.start()
            await done.wait()
        conn.send({seq: (latest[seq] - sent[seq]) / 1e9 for seq in latest})
    except TimeoutError:
        conn.send({"error": f"client timed out; received {sum(counts)}"})
    finally:
        for s in subs:
            with contextlib.suppress(Exception):
                await s.close()
        for ch in channels:
            await ch.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=2000)
    parser.add_argument("--publishes", type=int, default=20)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=50.0)
    parser.add_argument("--profile", action="store_true", help="cProfile the server")
    args = parser.parse_args()
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
        proc = ctx.Process(target=client_main, args=(child, port, n, args.publishes, args.budget_s))
        proc.start()
        clients.append((proc, parent))
    srv = srv_parent.recv()
    per_seq: dict[int, float] = {}
    for proc, parent in clients:
        got = parent.recv() if parent.poll(args.budget_s + 5) else {"error": "no reply"}
        proc.join(10)
        if "error" in got:
            print("client:", got["error"])
            continue
        for seq, lat in got.items():
            per_seq[seq] = max(per_seq.get(seq, 0.0), lat)
    server.join(10)
    if "error" in srv:
        print("server:", srv["error"])
        sys.exit(1)
    lat_ms = [v * 1000 for v in per_seq.values()]
    pub_us = [v * 1e6 for v in srv["publish_cpu_s"]]  # type: ignore[union-attr]
    print(
        f"subscribers={args.subscribers} publishes={len(lat_ms)} client_procs={args.client_procs}"
    )
    print(
        f"publish->last subscriber latency ms: p50={pct(lat_ms, 0.5):.1f} "
        f"p99={pct(lat_ms, 0.99):.1f} max={max(lat_ms):.1f} mean={statistics.mean(lat_ms):.1f}"
    )
    print(
        f"publisher CPU per publish() call: p50={pct(pub_us, 0.5) / 1000:.2f} ms "
        f"max={max(pub_us) / 1000:.2f} ms"
    )
    drain_ms = [v * 1000 for v in srv["drain_s"]]  # type: ignore[union-attr]
    if drain_ms:
        print(
            f"server side, publish -> last poll reply handed to gRPC ms: "
            f"p50={pct(drain_ms, 0.5):.1f} p99={pct(drain_ms, 0.99):.1f}"
        )
    server_cpu = float(srv["server_cpu_s"])  # type: ignore[arg-type]
    print(
        f"server process CPU (publish + {args.subscribers} replies + re-polls): "
        f"{server_cpu / len(lat_ms) * 1000:.1f} ms per publish"
    )


if __name__ == "__main__":
    main()
