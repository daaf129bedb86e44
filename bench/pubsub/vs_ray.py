"""Pubsub fan-out, ours against Ray 2.60's own ``gcs_server``, same harness, same run.

    python bench/pubsub/vs_ray.py [--subscribers 500,1000,2000] [--publishes 15]
                                  [--client-procs 4] [--servers ours,ray] [--rounds 1]
                                  [--py-spy FILE.svg]

For each subscriber count and each server (a fresh process each time, loopback only):
``--client-procs`` processes host raylet-cheap long-poll subscribers (raw request bytes,
one HTTP/2 connection each, ``ray_cluster_id`` metadata as Ray's clients send it), all
subscribed to GCS_NODE_INFO_CHANNEL.  A coordinator then calls ``RegisterNode`` once per
publish (a new node id; the send time rides in ``node_name``), waits until every
subscriber has received it and polled again, and repeats.

Per configuration it prints:
  * publish -> last subscriber received (p50, p99) and -> first subscriber (p50);
  * RegisterNode reply latency (p50);
  * server CPU per publish: utime+stime of the server process from /proc/<pid>/stat over
    the whole publishing window (publish, every reply, every re-poll), divided by the
    number of publishes.

``ours`` is ``gcs serve`` as deployed: the front server (gcs.front) on the port, the
pubsub methods answered by it, everything else relayed to grpc.aio; ``grpc`` is ``gcs serve``
with ``GCS_FRONT_SERVER=0`` (grpc.aio alone on the port, the path before the front server).
``--servers ours,floor,ray`` adds ``floor_server.py``, a bare grpc.aio server with no
application code: gRPC's own share of our cost; ``lean`` adds ``lean_server.py``, our
Publisher behind a prototype hand-rolled HTTP/2 transport (what leaving grpc.aio would buy).

Ray's binary is found in the cached interop venv (tests/interop/venvs.py) or at
``--ray-gcs-server``.  Both servers get health checks and load polls pushed out of the
window (``health_check_initial_delay_ms`` / ``gcs_pull_resource_loads_period_milliseconds``
one hour) so only the fan-out is measured.  The machine is shared: the comparison is
relative within one run; the load average is printed next to every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

_POLL = "/ray.rpc.ControlPlanePubSubGcsService/GcsSubscriberPoll"
_COMMAND = "/ray.rpc.ControlPlanePubSubGcsService/GcsSubscriberCommandBatch"
_REGISTER = "/ray.rpc.NodeInfoGcsService/RegisterNode"
_CLUSTER_ID = "/ray.rpc.NodeInfoGcsService/GetClusterId"
_HOUR_MS = 3_600_000
_CLK_TCK = os.sysconf("SC_CLK_TCK")
NIL_PUBLISHER_ID = b"\xff" * 28


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if not n:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (all threads) in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---- servers ----------------------------------------------------------------------------


def ray_gcs_server_binary() -> Path | None:
    from tests.interop.venvs import RAY, cache_root

    for cand in sorted((cache_root() / RAY.name / "lib").glob("python3*/site-packages")):
        path = cand / "ray/core/src/ray/gcs/gcs_server"
        if path.exists():
            return path
    return None


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    address: str
    workdir: tempfile.TemporaryDirectory[str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.workdir.cleanup()


def start_ours(port: int, *, front: bool = True) -> Server:
    """``gcs serve``: with the front server (``ours``, the default) or grpc.aio alone on the
    port (``grpc``, ``GCS_FRONT_SERVER=0``)."""
    name = "ours" if front else "grpc"
    work = tempfile.TemporaryDirectory(prefix=f"gcs-bench-{name}-")
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(REPO),
        GCS_FRONT_SERVER="1" if front else "0",
        RAY_health_check_initial_delay_ms=str(_HOUR_MS),
        RAY_gcs_pull_resource_loads_period_milliseconds=str(_HOUR_MS),
    )
    cmd = [
        sys.executable,
        "-c",
        "from gcs.cli.main import main; main()",
        "serve",
        "--host=127.0.0.1",
        f"--port={port}",
        "--storage=memory://",
        "--metrics-port=-1",
        "--log-level=warning",
    ]
    proc = subprocess.Popen(
        cmd, env=env, cwd=work.name, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return Server(name, proc, f"127.0.0.1:{port}", work)


def start_script(name: str, script: str, port: int) -> Server:
    """``floor_server.py`` (bare grpc.aio) or ``lean_server.py`` (hand-rolled HTTP/2)."""
    work = tempfile.TemporaryDirectory(prefix=f"gcs-bench-{name}-")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, str(Path(__file__).with_name(script)), str(port)]
    proc = subprocess.Popen(
        cmd, env=env, cwd=work.name, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return Server(name, proc, f"127.0.0.1:{port}", work)


def start_ray(port: int, binary: Path, config: dict[str, object] | None = None) -> Server:
    """Ray's ``gcs_server``; ``config`` (system config) defaults to health checks and load
    polls pushed an hour out (only the fan-out is measured here)."""
    work = tempfile.TemporaryDirectory(prefix="gcs-bench-ray-")
    if config is None:
        config = {
            "health_check_initial_delay_ms": _HOUR_MS,
            "gcs_pull_resource_loads_period_milliseconds": _HOUR_MS,
        }
    cmd = [
        str(binary),
        f"--log_dir={work.name}",
        "--config_list=" + base64.b64encode(json.dumps(config).encode()).decode(),
        f"--gcs_server_port={port}",
        "--metrics-agent-port=0",
        "--node-ip-address=127.0.0.1",
        "--session-name=pubsub-bench",
        f"--session-dir={work.name}",
        "--node-id=" + os.urandom(28).hex(),
    ]
    proc = subprocess.Popen(
        cmd, cwd=work.name, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return Server("ray", proc, f"127.0.0.1:{port}", work)


async def _cluster_id(address: str, timeout_s: float) -> bytes:
    import grpc

    from gcs.proto import gcs_service_pb2

    async with grpc.aio.insecure_channel(address) as ch:
        await asyncio.wait_for(ch.channel_ready(), timeout_s)
        call = ch.unary_unary(_CLUSTER_ID)
        raw = await call(b"", timeout=timeout_s)
        return gcs_service_pb2.GetClusterIdReply.FromString(raw).cluster_id


# ---- clients ----------------------------------------------------------------------------


def client_main(
    conn: Connection,
    address: str,
    cluster_hex: str,
    subscribers: int,
    first_index: int,
    budget_s: float,
) -> None:
    asyncio.run(_client(conn, address, cluster_hex, subscribers, first_index, budget_s))


async def _client(
    conn: Connection,
    address: str,
    cluster_hex: str,
    subscribers: int,
    first_index: int,
    budget_s: float,
) -> None:
    """Raylet-cheap subscribers: raw bytes, one coroutine and one connection each.

    Every subscriber of one publish gets the same reply bytes, so a reply is parsed once
    per distinct value (standing in for the microsecond C++ parse a raylet does).  For each
    publish (keyed by the send time in ``node_name``) the first and last receive times in
    this process go back to the coordinator once all subscribers here have it.
    """
    import grpc

    from gcs.proto import gcs_service_pb2, pubsub_pb2

    node_channel = pubsub_pb2.ChannelType.Value("GCS_NODE_INFO_CHANNEL")
    md = (("ray_cluster_id", cluster_hex),)
    opts = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(address, options=opts) for _ in range(subscribers)]
    parsed: dict[bytes, tuple[bytes, int, int]] = {}  # reply -> (publisher id, top seq, stamp)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    count: dict[int, int] = {}
    polling = [0]
    all_polling = asyncio.Event()
    stop = asyncio.Event()

    def parse(reply: bytes) -> tuple[bytes, int, int]:
        msg = gcs_service_pb2.GcsSubscriberPollReply.FromString(reply)
        top = stamp = 0
        for m in msg.pub_messages:
            if m.sequence_id > top:
                top = m.sequence_id
                stamp = int(m.node_info_message.node_name or 0)
        return msg.publisher_id, top, stamp

    async def subscriber(i: int) -> None:
        sid = (first_index + i).to_bytes(28, "big")
        poll = channels[i].unary_unary(_POLL)
        head = b"\x0a\x1c" + sid
        pid_part = b"\x1a\x1c" + NIL_PUBLISHER_ID
        seq_part = b""
        started = False
        while not stop.is_set():
            fut = poll(head + seq_part + pid_part, metadata=md)
            if not started:
                started = True
                polling[0] += 1
                if polling[0] == subscribers:
                    all_polling.set()
            try:
                reply = await fut
            except grpc.aio.AioRpcError:
                if stop.is_set():
                    return
                raise
            now = time.time_ns()
            info = parsed.get(reply)
            if info is None:
                info = parsed[reply] = parse(reply)
            pid, top, stamp = info
            pid_part = b"\x1a\x1c" + pid
            if not top:
                continue
            seq_part = b"\x10" + _varint(top)
            if stamp:
                first.setdefault(stamp, now)
                last[stamp] = now
                n = count[stamp] = count.get(stamp, 0) + 1
                if n == subscribers:
                    conn.send(("got", stamp, first[stamp], now))

    def command(i: int) -> bytes:
        req = gcs_service_pb2.GcsSubscriberCommandBatchRequest(
            subscriber_id=(first_index + i).to_bytes(28, "big")
        )
        req.commands.add(channel_type=node_channel).subscribe_message.SetInParent()
        return req.SerializeToString()

    tasks: list[asyncio.Task[None]] = []
    try:
        async with asyncio.timeout(budget_s):
            for k in range(0, subscribers, 50):  # connect gently: the listen backlog is finite
                await asyncio.gather(*(ch.channel_ready() for ch in channels[k : k + 50]))
            for k in range(0, subscribers, 200):
                await asyncio.gather(
                    *(
                        channels[i].unary_unary(_COMMAND)(command(i), metadata=md)
                        for i in range(k, min(subscribers, k + 200))
                    )
                )
            cpu0 = time.process_time()
            tasks = [asyncio.create_task(subscriber(i)) for i in range(subscribers)]
            await all_polling.wait()
            conn.send(("ready",))
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, conn.recv)  # "stop"
            conn.send(("cpu", time.process_time() - cpu0))
    except TimeoutError:
        conn.send(("error", "client timed out"))
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in channels:
            await ch.close()


# ---- coordinator ------------------------------------------------------------------------


@dataclass
class Result:
    server: str
    subscribers: int
    last_ms: list[float]
    first_ms: list[float]
    register_ms: list[float]
    server_cpu_ms_per_publish: float
    client_cpu_ms_per_publish: float
    rss_mb: float
    load: str


def run_one(
    server: Server,
    subscribers: int,
    publishes: int,
    client_procs: int,
    budget_s: float,
    attach: str | None,
) -> Result:
    import grpc

    from gcs.proto import gcs_pb2, gcs_service_pb2

    cluster_id = asyncio.run(_cluster_id(server.address, 20.0))
    cluster_hex = cluster_id.hex()
    ctx = mp.get_context("spawn")
    clients: list[tuple[mp.process.BaseProcess, Connection]] = []
    per = subscribers // client_procs
    for k in range(client_procs):
        n = per if k < client_procs - 1 else subscribers - per * k
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=client_main,
            args=(child, server.address, cluster_hex, n, 1 + k * per, budget_s),
            daemon=True,
        )
        proc.start()
        clients.append((proc, parent))
    deadline = time.monotonic() + budget_s
    try:
        for _, parent in clients:
            if not parent.poll(max(0.1, deadline - time.monotonic())):
                raise RuntimeError(f"{server.name}: clients not ready in time")
            msg = parent.recv()
            if msg[0] != "ready":
                raise RuntimeError(f"{server.name}: client said {msg}")
        time.sleep(1.0)  # let the last first polls reach the server

        channel = grpc.insecure_channel(server.address)
        register = channel.unary_unary(_REGISTER)
        md = (("ray_cluster_id", cluster_hex),)
        last_ms: list[float] = []
        first_ms: list[float] = []
        register_ms: list[float] = []
        spy = None
        if attach:
            spy = subprocess.Popen(
                attach.format(pid=server.pid, server=server.name, subscribers=subscribers),
                shell=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
        cpu0 = proc_cpu_s(server.pid)
        for i in range(publishes):
            stamp = time.time_ns()
            info = gcs_pb2.GcsNodeInfo(
                node_id=os.urandom(28),
                node_name=str(stamp),
                node_manager_address="127.0.0.1",
                node_manager_port=40000 + i,
                object_manager_port=41000 + i,
                state=gcs_pb2.GcsNodeInfo.ALIVE,
            )
            info.resources_total["CPU"] = 1.0
            req = gcs_service_pb2.RegisterNodeRequest(node_info=info)
            register(req.SerializeToString(), metadata=md, timeout=60)
            register_ms.append((time.time_ns() - stamp) / 1e6)
            firsts, lasts = [], []
            for _, parent in clients:
                if not parent.poll(max(0.1, deadline - time.monotonic())):
                    raise RuntimeError(f"{server.name}: publish {i} not delivered in time")
                msg = parent.recv()
                if msg[0] != "got" or msg[1] != stamp:
                    raise RuntimeError(f"{server.name}: unexpected {msg}")
                firsts.append(msg[2])
                lasts.append(msg[3])
            first_ms.append((min(firsts) - stamp) / 1e6)
            last_ms.append((max(lasts) - stamp) / 1e6)
            time.sleep(0.3)  # the re-polls land (counted in the CPU window)
        cpu = proc_cpu_s(server.pid) - cpu0
        rss = proc_rss_mb(server.pid)
        if spy is not None:
            with contextlib.suppress(ProcessLookupError):
                spy.send_signal(signal.SIGINT)
            spy.wait(60)
        load = load_avg()
        client_cpu = 0.0
        for _, parent in clients:
            parent.send("stop")
        for _, parent in clients:
            if parent.poll(20):
                msg = parent.recv()
                if msg[0] == "cpu":
                    client_cpu += msg[1]
        channel.close()
        return Result(
            server.name,
            subscribers,
            last_ms,
            first_ms,
            register_ms,
            cpu / publishes * 1000,
            client_cpu / publishes * 1000,
            rss,
            load,
        )
    finally:
        for proc, _ in clients:
            proc.join(15)
            if proc.is_alive():
                proc.kill()


def start(name: str, ray_binary: Path | None) -> Server:
    port = free_port()
    if name in ("ours", "grpc"):
        server = start_ours(port, front=name == "ours")
    elif name == "floor":
        server = start_script(name, "floor_server.py", port)
    elif name == "lean":
        server = start_script(name, "lean_server.py", port)
    else:
        if ray_binary is None:
            raise SystemExit("Ray's gcs_server binary not found (build the interop venv)")
        server = start_ray(port, ray_binary)
    try:
        asyncio.run(_cluster_id(server.address, 30.0))
    except Exception:
        server.stop()
        raise
    return server


def report(r: Result) -> str:
    return (
        f"{r.server:5} subs={r.subscribers:5}  last p50={pct(r.last_ms, 0.5):6.1f} "
        f"p99={pct(r.last_ms, 0.99):6.1f} ms  first p50={pct(r.first_ms, 0.5):5.1f} ms  "
        f"RegisterNode p50={pct(r.register_ms, 0.5):6.1f} ms  "
        f"server CPU/publish={r.server_cpu_ms_per_publish:6.1f} ms  "
        f"clients CPU/publish={r.client_cpu_ms_per_publish:6.1f} ms  "
        f"server RSS={r.rss_mb:5.0f} MB  load=[{r.load}]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", default="500,1000,2000")
    parser.add_argument("--publishes", type=int, default=15)
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument(
        "--servers",
        default="ours,ray",
        help="any of ours (gcs serve, front server), grpc (gcs serve, grpc.aio alone), ray, "
        "floor (bare grpc.aio), lean (prototype HTTP/2 transport)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="repeat every configuration")
    parser.add_argument("--budget-s", type=float, default=120.0, help="per configuration")
    parser.add_argument("--ray-gcs-server", type=Path, default=None)
    parser.add_argument(
        "--attach",
        default=None,
        help="shell command run over the publishing window, SIGINT at its end; {pid}, "
        "{server}, {subscribers} are filled in (e.g. 'exec strace -c -f -p {pid} -o "
        "/tmp/{server}.txt' or 'exec py-spy record --native -p {pid} -o /tmp/{server}.json "
        "-f speedscope')",
    )
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    ray_binary = args.ray_gcs_server or ray_gcs_server_binary()
    counts = [int(x) for x in args.subscribers.split(",")]
    names = args.servers.split(",")
    results: list[Result] = []
    print(f"load before: [{load_avg()}]  cpus={os.cpu_count()}", flush=True)
    for rnd in range(args.rounds):
        for n in counts:
            order = names if rnd % 2 == 0 else names[::-1]
            for name in order:
                server = start(name, ray_binary)
                try:
                    r = run_one(
                        server, n, args.publishes, args.client_procs, args.budget_s, args.attach
                    )
                finally:
                    server.stop()
                results.append(r)
                print(report(r), flush=True)
    print()
    print("| subscribers | server | last p50 ms | last p99 ms | first p50 ms | CPU/publish ms |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.subscribers} | {r.server} | {pct(r.last_ms, 0.5):.0f} | "
            f"{pct(r.last_ms, 0.99):.0f} | {pct(r.first_ms, 0.5):.1f} | "
            f"{r.server_cpu_ms_per_publish:.0f} |"
        )
    with contextlib.suppress(Exception):
        means = statistics.mean(r.server_cpu_ms_per_publish for r in results)
        print(f"(mean server CPU/publish over all rows: {means:.0f} ms)")


if __name__ == "__main__":
    main()
