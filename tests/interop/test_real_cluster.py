"""A real Ray 2.60 cluster on our GCS: ``gcs serve --head`` + unmodified ``ray start``.

Our GCS runs as ``gcs serve --head`` on 127.0.0.2; two real worker nodes join it with
``ray start --address`` (127.0.0.2 and 127.0.0.3, Ray's wheel in its own venv), and driver
subprocesses use ``ray.init(address=...)``.  Ray's raylets learn each other's resources
through our syncer hub, so work spreads over both nodes; raylets start a job's workers once
the job is published on GCS_JOB.  Every process is started in its own process group and
killed by group at the end (``ray stop`` would not find raylets under private temp dirs).
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
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from gcs.proto import gcs_pb2, gcs_service_pb2
from gcs.testing.servers import free_port
from tests.interop import venvs

pytestmark = [pytest.mark.interop, pytest.mark.slow]

GCS_HOST = "127.0.0.2"
WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
START_TIMEOUT_S = 240.0
"""Generous: two raylets, their agents and our GCS start on a loaded 2-core machine."""

DRIVER = textwrap.dedent(
    """
    import collections, json, sys, time, ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=sys.argv[1], logging_level="ERROR")
    me = ray.get_runtime_context().get_node_id()

    @ray.remote(num_cpus=1)
    def where(i):
        time.sleep(1.0)  # long enough that the other node's cold worker start wins
        return ray.get_runtime_context().get_node_id()

    plain = collections.Counter(ray.get([where.remote(i) for i in range(100)], timeout=600))
    spread = collections.Counter(ray.get(
        [where.options(scheduling_strategy="SPREAD").remote(i) for i in range(8)], timeout=600))
    alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    other = [n for n in alive if n != me][0]
    pinned = ray.get(where.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(other, soft=False)).remote(0),
        timeout=300)
    print(json.dumps({"me": me, "alive": alive, "plain": plain, "spread": spread,
                      "other": other, "pinned": pinned}))
    """
)


@dataclass
class Cluster:
    address: str
    tmp: pathlib.Path
    ray_bin: pathlib.Path
    python: pathlib.Path
    env: dict[str, str]
    temp_dirs: list[pathlib.Path] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def logs(self) -> str:
        parts = []
        for path in sorted(self.tmp.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)

    def run(self, args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """A client process in its own group, killed by group if it outlives ``timeout``."""
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            raise AssertionError(f"{args[:3]} timed out\n{err[-3000:]}\n{self.logs()}") from None
        return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _ray_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1")
    return env


def _kill_group(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace_s: float = 20) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group's stragglers too (raylet, agents)
    proc.wait()


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout_s} s\n{cluster.logs()}")
        time.sleep(0.5)


def _synced_raylets(address: str) -> int:
    """Alive raylets in our GCS's node table whose syncer view arrived (their
    ``state_snapshot`` is set from it; the virtual head is not in the table)."""
    with grpc.insecure_channel(address) as channel:
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
    undefined = gcs_pb2.NodeSnapshot.UNDEFINED
    return sum(1 for n in reply.node_info_list if n.state_snapshot.state != undefined)


def _started(c: Cluster) -> bool:
    logs = [c.tmp / f"worker{i}.log" for i in range(len(WORKER_HOSTS))]
    return all(
        p.exists() and "Ray runtime started" in p.read_text(errors="replace") for p in logs
    ) and _synced_raylets(c.address) == len(WORKER_HOSTS)


@pytest.fixture(scope="module")
def cluster(ray_venv: venvs.Venv) -> Iterator[Cluster]:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rayc", dir="/tmp"))
    port = free_port()
    c = Cluster(
        address=f"{GCS_HOST}:{port}",
        tmp=tmp,
        ray_bin=pathlib.Path(ray_venv.python).parent / "ray",
        python=pathlib.Path(ray_venv.python),
        env=_ray_env(),
    )
    try:
        gcs_log = (tmp / "gcs.log").open("wb")
        c.procs.append(
            subprocess.Popen(
                [
                    sys.executable, "-m", "gcs", "serve", "--head", "--host", GCS_HOST,
                    "--port", str(port), "--storage", "memory://", "--metrics-port", "-1",
                    "--temp-dir", str(tmp / "head"), "--log-format", "json",
                ],
                stdout=gcs_log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        )  # fmt: skip
        for i, host in enumerate(WORKER_HOSTS):
            temp_dir = pathlib.Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
            c.temp_dirs.append(temp_dir)
            log = (tmp / f"worker{i}.log").open("wb")
            c.procs.append(
                subprocess.Popen(
                    [
                        str(c.ray_bin), "start", "--address", c.address, "--block",
                        f"--node-ip-address={host}", "--num-cpus=2",
                        f"--temp-dir={temp_dir}",
                    ],
                    stdout=log, stderr=subprocess.STDOUT, env=c.env, start_new_session=True,
                )
            )  # fmt: skip
        _wait(
            lambda: _started(c) or any(p.poll() is not None for p in c.procs),
            START_TIMEOUT_S,
            "two worker nodes started and synced",
            c,
        )
        assert all(p.poll() is None for p in c.procs), c.logs()
        yield c
    finally:
        for proc in reversed(c.procs):
            _kill_group(proc)
        for temp_dir in c.temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def test_tasks_spread_over_both_workers_spread_and_node_affinity(cluster: Cluster) -> None:
    """100 tasks run on both nodes, SPREAD uses both, a hard NodeAffinity to the node the
    driver is not on runs there (each needs the raylets to see each other's resources)."""
    done = cluster.run([str(cluster.python), "-c", DRIVER, cluster.address], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:] + cluster.logs()
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out["alive"]) == 2, out
    assert sum(out["plain"].values()) == 100
    assert set(out["plain"]) == set(out["alive"]), f"every node runs some: {out['plain']}"
    assert set(out["spread"]) == set(out["alive"]), f"SPREAD uses both: {out['spread']}"
    assert out["pinned"] == out["other"] != out["me"]


def test_ray_status_shows_both_workers(cluster: Cluster) -> None:
    done = cluster.run([str(cluster.ray_bin), "status", "--address", cluster.address], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(" node_") == 2, done.stdout
    assert "/4.0 CPU" in done.stdout, done.stdout


def test_no_process_logs_unimplemented_worker_or_task_rpcs(cluster: Cluster) -> None:
    """After a job ran, no Ray process logged a GCS method we do not serve."""
    done = cluster.run([str(cluster.python), "-c", DRIVER, cluster.address], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    offending = []
    for temp_dir in cluster.temp_dirs:
        for path in temp_dir.glob("session_*/logs/*"):
            if not path.is_file():
                continue
            text = path.read_text(errors="replace")
            for line in text.splitlines():
                if "Method not found" in line or "UNIMPLEMENTED" in line:
                    offending.append(f"{path.name}: {line[-300:]}")
    assert not offending, "\n".join(offending[:20])
