"""GCS CPU per operation on real Ray 2.60 workloads, several GCSs side by side, interleaved.

    .venv/bin/python -m bench.gcs.workload_cpu [--servers ours,ray] [--rounds 3]
        [--workloads actors,pgs,tasks,idle] [--actors 40] [--pgs 200] [--tasks 2000]
        [--base DIR] [--profile DIR]

Every cluster starts first and stays up (so the rounds interleave on a shared, noisy
machine): ``ours`` is ``gcs serve --head`` (memory store) from this checkout, ``base`` the
same from another checkout (``--base``, e.g. ``git archive main`` unpacked: before/after of a
change in one run), ``uv`` this checkout with ``GCS_EVENT_LOOP=uvloop``, ``ray`` is
Ray's ``ray start --head --num-cpus=0`` (its ``gcs_server``); ``--variant NAME=YAML`` adds
this checkout with a config file.
Each has one ``ray start --address`` worker of 4 CPUs and one long-lived driver; every port
any node opens is chosen free (tests/interop/stock_ray.node_ports) and every cluster binds
its own loopback address.  Per round and workload, each GCS in turn (order rotated per
round):

* ``actors``: ``--actors`` times an actor (``num_cpus=0``) created, first call answered,
  ``ray.kill``;
* ``pgs``: ``--pgs`` times a 2-bundle PACK group created, ``pg.wait()``, removed;
* ``tasks``: ``--tasks`` tiny tasks at once (task events on, Ray's default), then the task
  events flushed (2 s) and ``GetTaskEvents`` called 5 times by this process;
* ``idle``: 20 s with nothing running.

Printed per workload and GCS: GCS CPU ms per operation (utime+stime from /proc) of every
round, their median, p50 latency, and the ratio to the first server; RSS (VmRSS) after
start-up, after each workload and at the end.  ``--profile DIR``: py-spy records ``ours``
during every workload (speedscope JSON under DIR; ``--gil``: samples holding the GIL, so a
thread runnable but waiting for a CPU inside a syscall, common on a loaded machine, is not
counted as work).
Logs stay in the printed directory when a start fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import grpc

from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.testing.ports import free_port
from tests.interop import venvs
from tests.interop.ray_processes import our_env, ray_env
from tests.interop.stock_ray import node_ports

HOSTS = {"ours": "127.0.0.6", "ray": "127.0.0.7", "base": "127.0.0.8", "uv": "127.0.0.9"}
VARIANT_HOSTS = ("127.0.0.10", "127.0.0.11", "127.0.0.12")
"""Hosts of ``--variant`` servers, in order."""
DRIVER = """
import json, sys, time, ray
from ray.util.placement_group import placement_group, remove_placement_group
ray.init(address=sys.argv[1], logging_level="ERROR")
@ray.remote(num_cpus=0)
class A:
    def ping(self):
        return 1
@ray.remote(num_cpus=0.01)
def tiny():
    return 1
def actors(n):
    lat = []
    for _ in range(n):
        t = time.perf_counter(); a = A.remote(); ray.get(a.ping.remote(), timeout=300)
        lat.append(time.perf_counter() - t); ray.kill(a)
    return lat
def pgs(n):
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        pg = placement_group([{"CPU": 0.01}, {"CPU": 0.01}], strategy="PACK")
        assert pg.wait(timeout_seconds=300)
        lat.append(time.perf_counter() - t); remove_placement_group(pg)
    return lat
def tasks(n):
    t = time.perf_counter(); ray.get([tiny.remote() for _ in range(n)], timeout=600)
    return [time.perf_counter() - t]
ray.get([tiny.remote() for _ in range(50)])
actors(2); pgs(2)
print("@@ready", flush=True)
for line in sys.stdin:
    name, n = line.split()
    print("@@" + json.dumps(globals()[name](int(n))), flush=True)
"""


def cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pid_in_session(pattern: str, session: int) -> int:
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ProcessLookupError):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if pattern in cmd and os.getsid(int(entry.name)) == session:
                    return int(entry.name)
    raise RuntimeError(f"no process matching {pattern!r} in session {session}")


@dataclass
class Cluster:
    name: str
    ray_python: pathlib.Path
    logs: pathlib.Path
    checkout: pathlib.Path | None = None
    host: str = ""
    port: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    driver: subprocess.Popen[str] | None = None
    gcs_pid: int = 0
    rss_start: float = 0.0
    config: str = ""
    """A config file for ``gcs serve --config`` (a ``--variant``)."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def spawn(self, args: list[str], log: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        out = (self.logs / f"{self.name}-{log}.log").open("wb")
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            cwd=self.checkout,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def wait_log(self, log: str, text: str, proc: subprocess.Popen[bytes]) -> None:
        path = self.logs / f"{self.name}-{log}.log"
        deadline = time.monotonic() + 240
        while text not in path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{self.name}: {log} did not start; logs in {self.logs}")
            time.sleep(0.5)

    def start(self) -> None:
        self.host = self.host or HOSTS[self.name]
        self.port = free_port()
        ray_bin = str(self.ray_python.parent / "ray")
        renv = ray_env(None)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"wc{self.name}", dir="/tmp"))
        if self.name == "ray":
            head = self.spawn(
                [
                    ray_bin, "start", "--head", "--block", f"--node-ip-address={self.host}",
                    f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false",
                    f"--ray-client-server-port={free_port()}", f"--temp-dir={tmp}",
                    "--disable-usage-stats", *node_ports([self.port]),
                ],
                "head", renv,
            )  # fmt: skip
            self.wait_log("head", "Ray runtime started", head)
            self.gcs_pid = pid_in_session("gcs_server", os.getsid(head.pid))
        else:
            env = our_env(renv)
            if self.checkout is not None:
                env["PYTHONPATH"] = str(self.checkout)
            if self.name == "uv":
                env["GCS_EVENT_LOOP"] = "uvloop"
            head = self.spawn(
                [
                    sys.executable, "-m", "gcs", "serve", "--head", "--host", self.host,
                    "--port", str(self.port), "--storage", "memory://", "--metrics-port", "-1",
                    "--temp-dir", str(tmp), "--log-level", "warning",
                    *(["--config", self.config] if self.config else []),
                ],
                "gcs", env,
            )  # fmt: skip
            self.gcs_pid = head.pid
        worker = self.spawn(
            [
                ray_bin, "start", f"--address={self.address}", "--block",
                f"--node-ip-address={self.host}", "--num-cpus=4", f"--temp-dir={tmp}",
                "--disable-usage-stats", *node_ports([self.port]),
            ],
            "worker", renv,
        )  # fmt: skip
        self.wait_log("worker", "Ray runtime started", worker)
        self.driver = subprocess.Popen(
            [str(self.ray_python), "-c", DRIVER, self.address],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=renv,
            stderr=(self.logs / f"{self.name}-driver.log").open("wb"),
            start_new_session=True,
        )  # fmt: skip
        assert self.driver.stdout is not None
        if self.read_reply() != "ready":
            raise SystemExit(f"{self.name}: driver did not start; logs in {self.logs}")
        time.sleep(3)
        self.rss_start = rss_mib(self.gcs_pid)

    def call(self, name: str, n: int) -> list[float]:
        assert self.driver is not None and self.driver.stdin and self.driver.stdout
        self.driver.stdin.write(f"{name} {n}\n")
        self.driver.stdin.flush()
        result: list[float] = json.loads(self.read_reply())
        return result

    def read_reply(self) -> str:
        """The driver's next ``@@`` line (Ray prints its own lines on stdout too)."""
        assert self.driver is not None and self.driver.stdout
        for line in self.driver.stdout:
            if line.startswith("@@"):
                return line[2:].strip()
        raise SystemExit(f"{self.name}: driver died; logs in {self.logs}")

    def task_events(self, calls: int) -> None:
        # Ray's state API reads with its 512 MiB limit: 6,000 attempts pass grpc's default 4 MiB
        options = [("grpc.max_receive_message_length", 512 * 1024 * 1024)]
        with grpc.insecure_channel(self.address, options=options) as channel:
            stub = ServiceStub(channel, svc.TASK_INFO)
            for _ in range(calls):
                stub.GetTaskEvents(G.GetTaskEventsRequest(), timeout=60)

    def stop(self) -> None:
        procs: list[subprocess.Popen[bytes] | subprocess.Popen[str]] = [*self.procs]
        if self.driver is not None:
            procs.append(self.driver)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_workload(c: Cluster, workload: str, args: argparse.Namespace) -> tuple[int, list[float]]:
    if workload == "idle":
        time.sleep(args.idle_s)
        return 1, [0.0]
    if workload == "tasks":
        lat = c.call("tasks", args.tasks)
        time.sleep(2.5)  # task events flush every second
        c.task_events(5)
        return args.tasks, lat
    n = getattr(args, workload)
    return n, c.call(workload, n)


def profile_start(c: Cluster, out: pathlib.Path) -> subprocess.Popen[bytes]:
    spy = pathlib.Path(sys.executable).parent / "py-spy"
    return subprocess.Popen(
        [str(spy), "record", "--pid", str(c.gcs_pid), "--rate", "250", "--nonblocking",
         "--gil", "--format", "speedscope", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="ours,ray")
    parser.add_argument("--workloads", default="actors,pgs,tasks,idle")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--actors", type=int, default=40)
    parser.add_argument("--pgs", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--base", type=pathlib.Path, default=None)
    parser.add_argument("--profile", type=pathlib.Path, default=None)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=YAML: also this checkout with `gcs serve --config` of YAML text, e.g. "
        "'nofreeze=gc_freeze_survivors: false' (repeatable)",
    )
    args = parser.parse_args()
    ray_python = pathlib.Path(venvs.ensure_venv(venvs.RAY).python)
    logs = pathlib.Path(tempfile.mkdtemp(prefix="workload-cpu-"))
    names = args.servers.split(",")
    clusters = [Cluster(n, ray_python, logs, args.base if n == "base" else None) for n in names]
    for host, variant in zip(VARIANT_HOSTS, args.variant, strict=False):
        name, _, text = variant.partition("=")
        config = logs / f"{name}.yaml"
        config.write_text(text.replace("\\n", "\n") + "\n")
        clusters.append(Cluster(name, ray_python, logs, host=host, config=str(config)))
        names.append(name)
    print(f"logs in {logs}", flush=True)
    cpu: dict[tuple[str, str], list[float]] = {}
    p50: dict[tuple[str, str], list[float]] = {}
    ok = False
    try:
        for c in clusters:
            c.start()
            print(f"{c.name}: up, gcs pid {c.gcs_pid}, RSS {c.rss_start:.1f} MiB", flush=True)
        for r in range(args.rounds):
            order = clusters[r % len(clusters) :] + clusters[: r % len(clusters)]
            for workload in args.workloads.split(","):
                for c in order:
                    spy = None
                    if args.profile and c.name == "ours":
                        args.profile.mkdir(parents=True, exist_ok=True)
                        spy = profile_start(c, args.profile / f"{workload}-r{r}.speedscope.json")
                    before = cpu_s(c.gcs_pid)
                    n, lat = run_workload(c, workload, args)
                    used = cpu_s(c.gcs_pid) - before
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)
                        spy.wait()
                    cpu.setdefault((workload, c.name), []).append(1000 * used / n)
                    p50.setdefault((workload, c.name), []).append(1000 * statistics.median(lat))
                    print(
                        f"round {r} {workload:6} {c.name:4}: {1000 * used / n:8.3f} ms CPU/op  "
                        f"p50 {1000 * statistics.median(lat):8.1f} ms  "
                        f"RSS {rss_mib(c.gcs_pid):6.1f} MiB  (load1 {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
        print(f"\nsummary (median of {args.rounds} rounds; ratio to {names[0]}):")
        for workload in args.workloads.split(","):
            first = statistics.median(cpu[(workload, names[0])])
            for c in clusters:
                med = statistics.median(cpu[(workload, c.name)])
                runs = " ".join(f"{v:.3f}" for v in cpu[(workload, c.name)])
                print(
                    f"{workload:6} {c.name:4}: {med:8.3f} ms CPU/op [{runs}]  "
                    f"p50 {statistics.median(p50[(workload, c.name)]):8.1f} ms  "
                    f"x{med / first if first else 0:.2f}"
                )
        for c in clusters:
            print(
                f"RSS {c.name:4}: start {c.rss_start:6.1f} MiB  end {rss_mib(c.gcs_pid):6.1f} MiB"
            )
        ok = True
    finally:
        for c in clusters:
            c.stop()
        if ok:
            shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()
