"""A real Ray 2.60 cluster on our GCS, for interop tests and benches.

``gcs serve --head`` on a loopback address other than 127.0.0.1 (Ray rewrites that one to the
host's address), unmodified ``ray start --address`` worker nodes from Ray's wheel in its own
venv, and driver / CLI subprocesses.  Every process runs in its own process group and is
killed by group at the end (``ray stop`` would not find raylets under private temp dirs).
Every process (ours too) runs with the cluster's own HOME and TMPDIR and an explicit
RAY_AUTH_MODE (:func:`~tests.interop.ray_processes.ray_env`), whatever the machine's
``~/.ray`` holds.
The GCS can be killed (SIGKILL) and restarted on the same port and store mid-test.

    with real_cluster(ray_venv, workers=[Worker("127.0.0.2"), Worker("127.0.0.3")]) as c:
        out = c.driver(SCRIPT)          # the JSON the script printed last
        c.kill_gcs(); c.start_gcs()     # kill -9 and restart on the same store
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from gcs.proto import gcs_pb2, gcs_service_pb2
from gcs.testing.ports import free_port
from tests.interop import venvs
from tests.interop.ray_processes import NO_LOG_MONITOR, our_env, ray_env

GCS_HOST = "127.0.0.2"
_RUNNING = "Ray runtime started"
START_TIMEOUT_S = 240.0
"""Generous: raylets, their agents and our GCS start on a loaded 2-core machine."""
NODE_STOP_GRACE_S = 10.0
"""SIGTERM to SIGKILL for drivers and nodes, all of them together: ``ray start --block``
stops its raylet and agents with 1 s each (its drain is off: ``RAY_TIMERS``); what takes
longer on a loaded machine is killed."""
GCS_STOP_GRACE_S = 20.0
"""Our GCS stops its supervised children (dashboard, head raylet) before it exits: the
dashboard tests check that it did, so it gets the time to."""

FAST_HEALTH_CHECKS = {
    # A node that dies is found in ~4 s (Ray's 5 s delay + 5 x 3 s: ~20 s).  A live raylet
    # still has Ray's 10 s per check and 3 in a row to miss, and a load-poll reply within a
    # period counts as a check (gcs.managers.health), so a loaded machine does not fail it.
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
"""Our GCS's health checks (Ray's knob names, which ``gcs serve`` reads)."""


POLL_FIRST_S = 0.05
POLL_LONGEST_S = 1.0
"""The pauses of a wait on real processes grow from the first to the longest by half each
time: what holds at once is seen at once, and a long wait (a cluster starting, a job
running, a node found dead) checks about once a second, not five times.  Each check is a
process's work too: a gRPC call our GCS answers, a request Ray's dashboard turns into GCS
calls, a log file read again; at 0.2 s they were a good part of a module's CPU."""


def poll_pauses() -> Iterator[float]:
    """:data:`POLL_FIRST_S`, then half as long again each time, up to :data:`POLL_LONGEST_S`."""
    pause = POLL_FIRST_S
    while True:
        yield pause
        pause = min(pause * 1.5, POLL_LONGEST_S)


@dataclass(frozen=True)
class Worker:
    """One ``ray start --address`` node."""

    host: str
    num_cpus: int = 2
    resources: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for this node (e.g. ``RAY_NODE_TYPE_NAME``)."""
    args: tuple[str, ...] = ()
    log_monitor: bool = False
    """Ray's log monitor on this node (off: :data:`~tests.interop.ray_processes.NO_LOG_MONITOR`)."""


def stop_groups(procs: Sequence[subprocess.Popen[Any]], grace_s: float) -> None:
    """Stop processes started with ``start_new_session=True`` and everything they started:
    SIGTERM every process group at once, wait for their leaders ``grace_s`` in all (not per
    process), then SIGKILL what is left of every group."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def kill_group(proc: subprocess.Popen[Any], grace_s: float = NODE_STOP_GRACE_S) -> None:
    """SIGTERM the process group, SIGKILL what is left after ``grace_s`` (raylets, agents)."""
    stop_groups([proc], grace_s)


@dataclass
class RealCluster:
    ray_venv: venvs.Venv
    tmp: pathlib.Path
    port: int
    storage: str
    gcs_args: tuple[str, ...] = ()
    gcs_host: str = GCS_HOST
    env: dict[str, str] = field(default_factory=dict)
    """Ray processes' environment (:func:`ray_env` under ``tmp`` unless given)."""
    gcs: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    others: list[subprocess.Popen[Any]] = field(default_factory=list)
    temp_dirs: list[pathlib.Path] = field(default_factory=list)
    gcs_starts: int = 0
    killed: set[int] = field(default_factory=set)
    """Indexes of workers stopped on purpose (:meth:`kill_worker`)."""
    dashboard: str = ""
    """``http://host:port`` of the dashboard ``gcs serve --dashboard`` runs, when it does."""

    def __post_init__(self) -> None:
        if not self.env:
            self.env = ray_env(self.tmp / "env")

    @property
    def gcs_env(self) -> dict[str, str]:
        """Our GCS's environment (:func:`our_env`, which its dashboard and head raylet
        inherit) with its health checks."""
        return {**our_env(self.env), **FAST_HEALTH_CHECKS}

    @property
    def address(self) -> str:
        return f"{self.gcs_host}:{self.port}"

    @property
    def python(self) -> pathlib.Path:
        return pathlib.Path(self.ray_venv.python)

    @property
    def ray_bin(self) -> pathlib.Path:
        return self.python.parent / "ray"

    # -- processes -------------------------------------------------------------------------

    def start_gcs(self) -> None:
        """``gcs serve --head`` (again, after :meth:`kill_gcs`: same port, same store)."""
        assert self.gcs is None or self.gcs.poll() is not None, "the GCS is running"
        self.gcs_starts += 1
        log = (self.tmp / f"gcs{self.gcs_starts}.log").open("wb")
        self.gcs = subprocess.Popen(
            [
                sys.executable, "-m", "gcs", "serve", "--head", "--host", self.gcs_host,
                "--port", str(self.port), "--storage", self.storage, "--metrics-port", "-1",
                "--temp-dir", str(self.tmp / "head"), "--log-format", "json", *self.gcs_args,
            ],
            stdout=log, stderr=subprocess.STDOUT, env=self.gcs_env, start_new_session=True,
        )  # fmt: skip
        log.close()
        self.wait(self._gcs_serving, 60, "our GCS serving")

    def kill_gcs(self) -> None:
        """kill -9 our GCS (no shutdown path runs)."""
        assert self.gcs is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.gcs.pid, signal.SIGKILL)
        self.gcs.wait()

    def add_worker(self, worker: Worker) -> int:
        """Start one ``ray start --address --block`` node; returns its index."""
        index = len(self.workers)
        temp_dir = pathlib.Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
        self.temp_dirs.append(temp_dir)
        resources = [f"--resources={json.dumps(worker.resources)}"] if worker.resources else []
        log = (self.tmp / f"worker{index}.log").open("wb")
        self.workers.append(
            subprocess.Popen(
                [
                    str(self.ray_bin), "start", "--address", self.address, "--block",
                    f"--node-ip-address={worker.host}", f"--num-cpus={worker.num_cpus}",
                    f"--temp-dir={temp_dir}", *resources,
                    # agents bind their HTTP port on 127.0.0.1 too: one free port per node
                    f"--dashboard-agent-listen-port={free_port()}",
                    *(() if worker.log_monitor else (NO_LOG_MONITOR,)), *worker.args,
                ],
                stdout=log, stderr=subprocess.STDOUT, env={**self.env, **worker.env},
                start_new_session=True,
            )
        )  # fmt: skip
        log.close()
        return index

    def wait_workers(self, count: int | None = None, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until ``count`` (default: every started and not killed) worker printed "Ray
        runtime started" and that many alive raylets have a syncer view in our node table."""
        want = len(self.workers) - len(self.killed) if count is None else count

        def started() -> bool:
            if any(
                p.poll() is not None for i, p in enumerate(self.workers) if i not in self.killed
            ):
                raise AssertionError(f"a worker node exited\n{self.logs()}")
            logs = [self.tmp / f"worker{i}.log" for i in range(len(self.workers))]
            up = sum(1 for p in logs if p.exists() and _RUNNING in p.read_text("utf-8", "replace"))
            return up >= want and self.synced_raylets() >= want

        self.wait(started, timeout_s, f"{want} worker node(s) started and synced")

    def kill_worker(self, index: int) -> None:
        self.killed.add(index)
        kill_group(self.workers[index], grace_s=0)

    def spawn(
        self, args: Sequence[str], *, name: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A long-running process (a driver in the background, a dashboard), killed by group
        at the end; its output in ``<name>.log``."""
        log = (self.tmp / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            list(args), stdout=log, stderr=subprocess.STDOUT, env=env or self.env,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self.others.append(proc)
        return proc

    def run(
        self, args: Sequence[str], *, timeout: float, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A client process in its own group, killed by group if it outlives ``timeout``."""
        proc = subprocess.Popen(
            list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env or self.env, start_new_session=True,
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc, grace_s=0)
            out, err = proc.communicate()
            what = f"{list(args)[:3]} timed out\n{err[-3000:]}\n{self.logs()}"
            raise AssertionError(what) from None
        return subprocess.CompletedProcess(list(args), proc.returncode, out, err)

    def driver(
        self, script: str, *args: str, timeout: float = 900, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Run ``script`` with the Ray venv's python (``sys.argv[1]`` is the GCS address;
        ``env`` adds to the cluster's environment); returns the JSON object it printed on
        its last line."""
        done = self.run(
            [str(self.python), "-c", script, self.address, *args],
            timeout=timeout,
            env={**self.env, **env} if env else None,
        )
        assert done.returncode == 0, done.stderr[-3000:] + "\n" + self.logs()
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def close(self) -> None:
        """Drivers and nodes together, then our GCS (a raylet told to stop reports to it)."""
        stop_groups([*reversed(self.others), *reversed(self.workers)], NODE_STOP_GRACE_S)
        if self.gcs is not None:
            stop_groups([self.gcs], GCS_STOP_GRACE_S)
        for temp_dir in self.temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)

    # -- observation -----------------------------------------------------------------------

    def logs(self, tail: int = 2000) -> str:
        parts = []
        for path in sorted(self.tmp.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def ray_logs(self, pattern: str = "*") -> Iterator[pathlib.Path]:
        """The session log files of every worker node."""
        for temp_dir in self.temp_dirs:
            yield from (p for p in temp_dir.glob(f"session_*/logs/{pattern}") if p.is_file())

    def wait(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Until ``predicate()`` holds, polled on the wall clock: real Ray processes run on
        it, and what they do shows only in their logs and our GCS's tables (an exit is
        awaited with :meth:`wait_exit`).  ``timeout_s`` only bounds a hang."""
        deadline = time.monotonic() + timeout_s
        for pause in poll_pauses():
            if predicate():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not within {timeout_s} s\n{self.logs()}")
            time.sleep(pause)

    def wait_exit(self, proc: subprocess.Popen[Any], timeout_s: float, what: str) -> int:
        """Until ``proc`` exits (its exit, not a poll); returns its exit code."""
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{what} not within {timeout_s} s\n{self.logs()}") from None

    def alive_nodes(self) -> list[gcs_pb2.GcsNodeInfo]:
        """Alive nodes of our node table (the virtual head is not in it); [] when the GCS
        does not answer."""
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
                return []
        return list(reply.node_info_list)

    def synced_raylets(self) -> int:
        """Alive raylets whose syncer view arrived (``state_snapshot`` is set from it)."""
        undefined = gcs_pb2.NodeSnapshot.UNDEFINED
        return sum(1 for n in self.alive_nodes() if n.state_snapshot.state != undefined)

    def _gcs_serving(self) -> bool:
        assert self.gcs is not None
        if self.gcs.poll() is not None:
            raise AssertionError(f"our GCS exited with {self.gcs.returncode}\n{self.logs()}")
        with grpc.insecure_channel(self.address) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=1)
            except grpc.FutureTimeoutError:
                return False
        return True


@contextlib.contextmanager
def real_cluster(
    ray_venv: venvs.Venv,
    *,
    workers: Sequence[Worker] = (),
    storage: str = "memory://",
    gcs_args: Sequence[str] = (),
    gcs_host: str = GCS_HOST,
) -> Iterator[RealCluster]:
    """Our GCS as head plus ``workers`` started and synced; everything stopped at the end.
    ``storage`` may name a path under the cluster's temp dir with ``{tmp}``."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rayc", dir="/tmp"))
    cluster = RealCluster(
        ray_venv=ray_venv,
        tmp=tmp,
        port=free_port(),
        storage=storage.format(tmp=tmp),
        gcs_args=tuple(gcs_args),
        gcs_host=gcs_host,
    )
    try:
        cluster.start_gcs()
        for worker in workers:
            cluster.add_worker(worker)
        if workers:
            cluster.wait_workers()
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)
