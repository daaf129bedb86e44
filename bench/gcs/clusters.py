"""Small real Ray 2.60 clusters for the benches: our GCS or Ray's ``gcs_server`` at the head,
the same ``ray start --address`` workers under each, runnable on any machine.

Every port a process opens is chosen free: the GCS port (Ray's head would take 6379, which a
Redis on the machine often holds), the dashboard and Ray-client ports, and per node the
dashboard agent's HTTP and gRPC ports, the runtime-env agent's, the metrics export port, the
node and object manager ports (two nodes on one host would otherwise share the agent's
default 52365).  Worker processes bind ports the kernel picks (``--min-worker-port=0``), so
a burst of hundreds of actors needs no port range of its own.  Every process runs in its own
process group under a private HOME/TMPDIR (:func:`tests.interop.ray_processes.ray_env`) and
is killed by group at the end.

When a run fails its logs are kept: the reason and the log directory are printed on stderr
(with the tail of each log) and the directory is left in place; a run that succeeds
deletes them.

    with our_cluster(python) as c:      # or ray_cluster(python)
        c.start_workers()
        ... c.address, c.gcs_pid ...
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from gcs.proto import gcs_pb2, gcs_service_pb2
from gcs.testing.ports import free_ports
from tests.interop.ray_processes import our_env, ray_env

HOST = "127.0.0.2"
WORKERS = ("127.0.0.2", "127.0.0.3")
RUNNING = "Ray runtime started"
START_TIMEOUT_S = 300.0
STOP_GRACE_S = 20.0
_TICK = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


class BenchFailed(SystemExit):
    """A cluster did not come up or a driver failed; the message says why and where the
    logs are."""


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (seconds), from ``/proc``."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB."""
    values = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values["VmRSS"], values["VmHWM"]


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def node_ports(taken: Collection[int] = ()) -> list[str]:
    """``ray start`` arguments giving every port a node opens a free one (all distinct and
    none of ``taken``), workers on kernel-chosen ports."""
    ports = [p for p in free_ports(6 + len(taken)) if p not in taken][:6]
    http, agent_grpc, runtime_env, metrics, node_manager, object_manager = ports
    return [
        f"--dashboard-agent-listen-port={http}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--metrics-export-port={metrics}",
        f"--node-manager-port={node_manager}",
        f"--object-manager-port={object_manager}",
        "--min-worker-port=0",
        "--max-worker-port=0",
    ]


@dataclass
class Cluster:
    """One cluster's processes, its logs directory and its GCS's pid."""

    name: str
    python: pathlib.Path
    """The Ray venv's python (``ray`` is beside it)."""
    tmp: pathlib.Path = field(
        default_factory=lambda: pathlib.Path(tempfile.mkdtemp(prefix="rayb", dir="/tmp"))
    )
    host: str = HOST
    port: int = 0
    dashboard_port: int = 0
    client_port: int = 0
    gcs_pid: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workers: int = 0
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.port, self.dashboard_port, self.client_port = free_ports(3)
        self.env = ray_env(self.tmp / "env")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://{self.host}:{self.dashboard_port}"

    @property
    def ray_bin(self) -> pathlib.Path:
        return self.python.parent / "ray"

    def taken(self) -> list[int]:
        return [self.port, self.dashboard_port, self.client_port]

    def fail(self, reason: str) -> BenchFailed:
        return BenchFailed(f"{self.name}: {reason}; logs kept in {self.tmp}\n{self.logs()}")

    def spawn(
        self, args: Sequence[str], log: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with (self.tmp / log).open("wb") as out:
            proc = subprocess.Popen(
                list(args), stdout=out, stderr=subprocess.STDOUT, env=env or self.env,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def wait(self, predicate: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise self.fail(f"{what}: pid {dead[0].pid} exited with {dead[0].returncode}")
            if time.monotonic() > deadline:
                raise self.fail(f"{what}: not within {timeout_s:.0f} s")
            time.sleep(0.3)

    def logs(self, tail: int = 1500) -> str:
        parts = []
        for path in sorted(self.tmp.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def start_workers(self, hosts: Sequence[str] = WORKERS, num_cpus: int = 2) -> None:
        """``ray start --address --block`` nodes; returns once every one of them is alive in
        the GCS's node table."""
        before = self.alive_nodes()
        for host in hosts:
            index = self.workers
            self.workers += 1
            temp = self.tmp / f"w{index}"
            temp.mkdir()
            self.spawn(
                [
                    str(self.ray_bin), "start", "--address", self.address, "--block",
                    f"--node-ip-address={host}", f"--num-cpus={num_cpus}", f"--temp-dir={temp}",
                    *node_ports(self.taken()),
                ],
                f"worker{index}.log",
            )  # fmt: skip
        want = before + len(hosts)
        what = f"{len(hosts)} workers alive"
        self.wait(lambda: self.alive_nodes() >= want, what, START_TIMEOUT_S)

    def alive_nodes(self) -> int:
        """Alive nodes in the GCS's node table (0 when it does not answer)."""
        with grpc.insecure_channel(self.address) as channel:
            call = channel.unary_unary(
                "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=gcs_service_pb2.GetAllNodeInfoReply.FromString,
            )
            try:
                reply = call(
                    gcs_service_pb2.GetAllNodeInfoRequest(state_filter=gcs_pb2.GcsNodeInfo.ALIVE),
                    timeout=5,
                )
            except grpc.RpcError:
                return 0
        return len(reply.node_info_list)

    def driver(self, script: str, *args: str, timeout_s: float = 1800) -> str:
        """Run ``script`` with the Ray venv's python (``sys.argv[1]`` is the GCS address);
        its stdout.  A failure raises :class:`BenchFailed` with its stderr."""
        done = subprocess.run(
            [str(self.python), "-c", script, self.address, *args],
            capture_output=True, text=True, env=self.env, timeout=timeout_s, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            (self.tmp / "driver.log").write_text(done.stdout + "\n" + done.stderr)
            raise self.fail(f"driver exited with {done.returncode}: {done.stderr[-1500:]}")
        return done.stdout

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def _kept_on_failure(cluster: Cluster) -> Iterator[Cluster]:
    failed = True
    try:
        yield cluster
        failed = False
    except BenchFailed as exc:
        print(exc.code, file=sys.stderr, flush=True)
        raise
    except BaseException as exc:
        print(
            f"{cluster.name}: failed ({type(exc).__name__}: {exc}); logs kept in {cluster.tmp}",
            file=sys.stderr,
            flush=True,
        )
        raise
    finally:
        cluster.stop()
        if not failed:
            shutil.rmtree(cluster.tmp, ignore_errors=True)


@contextlib.contextmanager
def our_cluster(
    python: pathlib.Path, *, dashboard: bool = False, head_raylet: bool = False
) -> Iterator[Cluster]:
    """``gcs serve --head`` (memory store, metrics off) on :data:`HOST`; with ``dashboard``
    Ray's dashboard under it, with ``head_raylet`` a head raylet of 0 CPUs (both supervised
    by our GCS, on free ports)."""
    cluster = Cluster("ours", python)
    with _kept_on_failure(cluster):
        extra: list[str] = []
        if dashboard:
            extra += ["--dashboard", "--dashboard-port", str(cluster.dashboard_port)]
        if head_raylet:
            raylet_args = " ".join(["--num-cpus=0", *node_ports(cluster.taken())])
            extra += ["--head-raylet", "--head-raylet-args", raylet_args]
        if dashboard or head_raylet:
            extra += ["--ray-python", str(python)]
        proc = cluster.spawn(
            [
                sys.executable, "-m", "gcs", "serve", "--head", "--host", cluster.host,
                "--port", str(cluster.port), "--storage", "memory://", "--metrics-port", "-1",
                "--temp-dir", str(cluster.tmp / "head"), "--log-level", "warning", *extra,
            ],
            "gcs.log", env=our_env(cluster.env),
        )  # fmt: skip
        cluster.gcs_pid = proc.pid
        want = 1 if head_raylet else 0
        cluster.wait(
            lambda: _serving(cluster.address) and cluster.alive_nodes() >= want,
            "our GCS serving" + (" with its head raylet" if head_raylet else ""),
            START_TIMEOUT_S,
        )
        yield cluster


@contextlib.contextmanager
def ray_cluster(python: pathlib.Path, *, dashboard: bool = False) -> Iterator[Cluster]:
    """Ray's ``ray start --head --num-cpus=0`` on :data:`HOST` (its ``gcs_server``, head
    raylet and agents; only the ``gcs_server`` is measured), every port free."""
    cluster = Cluster("ray", python)
    with _kept_on_failure(cluster):
        head = cluster.spawn(
            [
                str(cluster.ray_bin), "start", "--head", "--block",
                f"--node-ip-address={cluster.host}", f"--port={cluster.port}", "--num-cpus=0",
                f"--include-dashboard={'true' if dashboard else 'false'}",
                f"--dashboard-host={cluster.host}", f"--dashboard-port={cluster.dashboard_port}",
                f"--ray-client-server-port={cluster.client_port}",
                f"--temp-dir={cluster.tmp / 'head'}", "--disable-usage-stats",
                *node_ports(cluster.taken()),
            ],
            "head.log",
        )  # fmt: skip
        cluster.wait(
            lambda: RUNNING in (cluster.tmp / "head.log").read_text(errors="replace"),
            "ray head started",
            START_TIMEOUT_S,
        )
        cluster.gcs_pid = _pid_in_session("gcs_server", os.getsid(head.pid))
        if cluster.gcs_pid == 0:
            raise cluster.fail("no gcs_server process in the head's session")
        yield cluster


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=1)
        except grpc.FutureTimeoutError:
            return False
    return True


def _pid_in_session(name: str, session: int) -> int:
    """The process whose executable is ``name`` in session ``session`` (0: none)."""
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode()
            if pathlib.Path(argv0).name == name and os.getsid(int(entry.name)) == session:
                return int(entry.name)
        except (OSError, ProcessLookupError):
            continue
    return 0


def last_json(out: str) -> dict:
    """The JSON object a driver printed on its last line."""
    result: dict = json.loads(out.strip().splitlines()[-1])
    return result
