"""Actor creation on real Ray 2.60 workers: our GCS against Ray's own ``gcs_server``, same run.

    python bench/gcs/actors_vs_ray.py [--actors 40] [--servers ours,ray]

For each server a fresh cluster on 127.0.0.2 (loopback only): Ray's is ``ray start --head``
with 4 CPUs; ours is ``gcs serve`` (memory store), our raylet agent as the head node (until
``gcs serve --head`` exists) and one ``ray start --address`` worker node with 4 CPUs.  One
driver then creates ``--actors`` actors one after the other (``num_cpus=0``, so they never
wait for resources), times ``.remote()`` -> first method call answered, and kills each with
``ray.kill``.  Printed per server: p50 / p95 / max creation latency, actors per second, and
the GCS process's CPU (utime+stime from /proc) over the driver's run, per actor.

Worker start-up (a Python process per actor) dominates the latency on both; the GCS CPU
per actor is the figure that is ours.  The machine is shared: compare within one run; the
load average is printed next to every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gcs.testing.ports import free_port  # noqa: E402
from tests.interop import venvs  # noqa: E402
from tests.interop.ray_processes import (  # noqa: E402
    ray_env,
    set_full_python_version,
    stop_group,
)

HOST = "127.0.0.2"
DRIVER = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
@ray.remote(num_cpus=0)
class A:
    def ping(self):
        return 1
lat = []
start = time.perf_counter()
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    a = A.remote()
    ray.get(a.ping.remote(), timeout=300)
    lat.append(time.perf_counter() - t)
    ray.kill(a)
print(json.dumps({"latencies": lat, "wall": time.perf_counter() - start}))
"""


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def find_pid(pattern: str) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if pattern in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    return int(entry.name)
    raise RuntimeError(f"no process matching {pattern!r}")


async def wait_port(port: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection(HOST, port)
            writer.close()
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"nothing listens on {HOST}:{port}")


async def run_one(server: str, actors: int, ray_python: Path, log_dir: Path) -> dict[str, float]:
    ray_bin = ray_python.parent / "ray"
    port = free_port()
    address = f"{HOST}:{port}"
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    procs: list[asyncio.subprocess.Process] = []

    async def spawn(name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = (log_dir / f"{server}-{name}.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True
        )
        procs.append(proc)

    try:
        if server == "ray":
            await spawn(
                "head", str(ray_bin), "start", "--head", "--block", f"--node-ip-address={HOST}",
                f"--port={port}", "--num-cpus=4", "--include-dashboard=false",
                f"--temp-dir={ray_tmp}", env=ray_env(None),
            )  # fmt: skip
            await wait_port(port)
            gcs_pid = find_pid(f"gcs_server_port={port}")
        else:
            await spawn(
                "gcs", sys.executable, "-m", "gcs.cli.main", "serve", "--host", HOST,
                "--port", str(port), "--storage", "memory://", "--metrics-port", "-1",
                "--log-level", "warning",
            )  # fmt: skip
            await wait_port(port)
            gcs_pid = procs[0].pid
            await spawn(
                "agent-head", sys.executable, "-m", "gcs.cli.main", "raylet", "--address", address,
                "--head", "--host", HOST, "--resources", '{"CPU": 0}',
            )  # fmt: skip
            await set_full_python_version(address, str(ray_python))
            await spawn(
                "worker", str(ray_bin), "start", f"--address={address}", "--block",
                f"--node-ip-address={HOST}", "--num-cpus=4", f"--temp-dir={ray_tmp}",
                env=ray_env(None),
            )  # fmt: skip
        await asyncio.sleep(5)  # the node settles (first registration, syncer retries)
        before = cpu_s(gcs_pid)
        driver = await asyncio.create_subprocess_exec(
            str(ray_python), "-c", DRIVER, address, str(actors),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ray_env(None),
        )  # fmt: skip
        out, err = await asyncio.wait_for(driver.communicate(), timeout=1800)
        if driver.returncode != 0:
            raise RuntimeError(err.decode()[-2000:])
        used = cpu_s(gcs_pid) - before
        result = json.loads(out.decode().strip().splitlines()[-1])
        lat = sorted(result["latencies"])
        return {
            "p50_ms": 1000 * lat[len(lat) // 2],
            "p95_ms": 1000 * lat[int(len(lat) * 0.95)],
            "max_ms": 1000 * lat[-1],
            "actors_per_s": len(lat) / result["wall"],
            "gcs_cpu_ms_per_actor": 1000 * used / len(lat),
            "load1": os.getloadavg()[0],
        }
    finally:
        for proc in reversed(procs):
            await stop_group(proc)
        shutil.rmtree(ray_tmp, ignore_errors=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--actors", type=int, default=40)
    parser.add_argument("--servers", default="ours,ray")
    args = parser.parse_args()
    venv = venvs.ensure_venv(venvs.RAY)
    log_dir = Path(tempfile.mkdtemp(prefix="actors-bench-"))
    print(f"{args.actors} actors per server; logs in {log_dir}")
    rows = {}
    for server in args.servers.split(","):
        rows[server] = await run_one(server, args.actors, Path(venv.python), log_dir)
        row = rows[server]
        print(
            f"{server:>5}: p50 {row['p50_ms']:7.1f} ms  p95 {row['p95_ms']:7.1f} ms  "
            f"max {row['max_ms']:7.1f} ms  {row['actors_per_s']:5.2f} actors/s  "
            f"GCS CPU {row['gcs_cpu_ms_per_actor']:6.2f} ms/actor  (load1 {row['load1']:.1f})"
        )
    if "ours" in rows and "ray" in rows:
        ours, ray = rows["ours"], rows["ray"]
        print(
            f"ours / ray: p50 latency {ours['p50_ms'] / ray['p50_ms']:.2f}x, "
            f"GCS CPU per actor {ours['gcs_cpu_ms_per_actor'] / ray['gcs_cpu_ms_per_actor']:.2f}x"
        )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        asyncio.run(main())
