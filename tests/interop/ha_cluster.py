"""A real Ray 2.60 cluster on a ``gcs serve --ha`` group (issue 29): members on one address
and one Redis namespace, each with its HA status port, any of them run from another source
tree (an older commit, for the rolling upgrade); ``ray start`` workers and a busy driver
that counts every failed call.  Every process is stopped by its process group."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gcs.testing.ports import free_port
from tests.interop import venvs
from tests.interop.real_cluster import GCS_HOST, RealCluster, Worker, poll_pauses, stop_groups

__all__ = ["BUSY_DRIVER", "HaMemberProc", "HaRayCluster", "ha_ray_cluster"]

MEMBER_STOP_GRACE_S = 20.0

BUSY_DRIVER = textwrap.dedent(
    """
    import json, os, sys, time, ray
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

    ray.init(address=sys.argv[1], namespace="ho", logging_level="ERROR")
    stop = sys.argv[2]

    @ray.remote(num_cpus=0)
    class Counter:
        def __init__(self):
            self.n = 0
        def incr(self):
            self.n += 1
            return self.n

    @ray.remote(num_cpus=1)
    def square(i):
        return i * i

    detached = Counter.options(name="ho_counter", lifetime="detached").remote()
    scoped = Counter.remote()
    rounds = ok = 0
    errors = []
    expected = 0
    while not os.path.exists(stop):
        rounds += 1
        try:
            assert ray.get([square.remote(i) for i in range(8)], timeout=120) == [
                i * i for i in range(8)]
            expected += 1
            got = ray.get([detached.incr.remote(), scoped.incr.remote()], timeout=120)
            assert got == [expected, expected], (got, expected)
            if rounds % 5 == 0:  # a new actor: registered and scheduled by the GCS
                extra = Counter.remote()
                assert ray.get(extra.incr.remote(), timeout=120) == 1
                ray.kill(extra)
            _internal_kv_put(b"ho_round", str(rounds).encode(), overwrite=True)
            assert _internal_kv_get(b"ho_round") == str(rounds).encode()
            assert sum(1 for n in ray.nodes() if n["Alive"]) >= 2
            ok += 1
        except Exception as err:
            errors.append(f"round {rounds}: {err!r}"[:400])
        print(f"progress {rounds}", flush=True)
    print(json.dumps({"rounds": rounds, "ok": ok, "failed": len(errors), "errors": errors[:5],
                      "counter": ray.get(detached.incr.remote(), timeout=120)}), flush=True)
    ray.kill(detached)
    """
)
"""Tasks, a detached and a job-scoped actor, a new actor every 5 rounds, InternalKV and the
node table from the driver, round after round until the stop file exists; every exception
counted.  Prints ``progress N`` per round, then a JSON summary."""


@dataclass
class HaMemberProc:
    name: str
    status_port: int
    log_path: pathlib.Path
    proc: subprocess.Popen[bytes]
    source: pathlib.Path | None

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if name is None or event.get("event") == name:
                        out.append(event)
        return out

    def wait_for(self, event: str, *, count: int = 1, timeout_s: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        for pause in poll_pauses():
            if time.monotonic() >= deadline:
                break
            found = self.events(event)
            if len(found) >= count:
                return found[count - 1]
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited with {self.proc.returncode}\n"
                    + self.log_path.read_text(errors="replace")[-3000:]
                )
            time.sleep(pause)
        raise AssertionError(f"{self.name} did not log {event} x{count} within {timeout_s} s")


@dataclass
class HaRayCluster:
    cluster: RealCluster
    namespace: str
    members: dict[str, HaMemberProc] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.cluster.address

    def start_member(self, name: str, source: pathlib.Path | None = None) -> HaMemberProc:
        """``gcs serve --ha --head`` named ``name``; ``source``: run that source tree (its
        ``gcs`` package first on the path) instead of this one, with this interpreter."""
        c = self.cluster
        status = free_port()
        log_path = c.tmp / f"member-{name}-{len(self.members)}.log"
        env = {
            **c.gcs_env,
            "GCS_HA_STATUS_PORT": str(status),
            "GCS_HA_HOLDER": name,
            "GCS_HA_LOCK_DIR": str(c.tmp / "ha-locks"),
        }
        if source is not None:
            env["PYTHONPATH"] = str(source)
        args = [
            sys.executable, "-m", "gcs", "serve", "--ha", "--head", "--host", c.gcs_host,
            "--port", str(c.port), "--storage", c.storage, "--namespace", self.namespace,
            "--metrics-port", "-1", "--temp-dir", str(c.tmp / "head"), "--log-format", "json",
        ]  # fmt: skip
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                cwd=str(source) if source is not None else None,
            )  # fmt: skip
        member = HaMemberProc(name, status, log_path, proc, source)
        self.members[name] = member
        return member

    def handover(self, name: str, to: str = "") -> dict[str, Any]:
        """``gcs ha handover`` (this tree's CLI) to member ``name``'s status port."""
        status = f"{self.cluster.gcs_host}:{self.members[name].status_port}"
        args = [sys.executable, "-m", "gcs", "ha", "handover", "--format", "json",
                "--status-address", status]  # fmt: skip
        if to:
            args += ["--to", to]
        done = subprocess.run(args, check=False, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr + self.cluster.logs()
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def stop_member(self, name: str, timeout_s: float = 60.0) -> int:
        """SIGTERM (a leader hands over first); its exit code."""
        proc = self.members[name].proc
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout_s)

    def progress(self, name: str = "driver") -> int:
        path = self.cluster.tmp / f"{name}.log"
        found = re.findall(r"^progress (\d+)$", path.read_text(errors="replace"), re.MULTILINE)
        return int(found[-1]) if found else 0

    def spawn_driver(self, stop_file: pathlib.Path) -> subprocess.Popen[bytes]:
        c = self.cluster
        return c.spawn([str(c.python), "-c", BUSY_DRIVER, c.address, str(stop_file)], name="driver")

    def driver_result(
        self, driver: subprocess.Popen[bytes], stop_file: pathlib.Path
    ) -> dict[str, Any]:
        stop_file.touch()
        code = self.cluster.wait_exit(driver, 300, "the driver's end")
        out = (self.cluster.tmp / "driver.log").read_text(errors="replace")
        assert code == 0, out[-3000:]
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result


@contextlib.contextmanager
def ha_ray_cluster(
    ray_venv: venvs.Venv, storage: str, keep_logs: pathlib.Path, workers: Sequence[Worker]
) -> Iterator[HaRayCluster]:
    """No member started yet: the test starts them (the first one leads), then
    :meth:`HaRayCluster.start_workers`.  Logs are copied to ``keep_logs`` at the end."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rayha", dir="/tmp"))
    cluster = RealCluster(
        ray_venv=ray_venv, tmp=tmp, port=free_port(), storage=storage, gcs_host=GCS_HOST
    )
    ha = HaRayCluster(cluster, namespace=f"ha{time.monotonic_ns()}")
    try:
        yield ha
    finally:
        try:
            cluster.close()
        finally:
            stop_groups([m.proc for m in ha.members.values()], MEMBER_STOP_GRACE_S)
            for path in tmp.glob("*.log"):
                shutil.copy(path, keep_logs / path.name)
            shutil.rmtree(tmp, ignore_errors=True)


def start_workers(ha: HaRayCluster, workers: Sequence[Worker]) -> None:
    for worker in workers:
        ha.cluster.add_worker(worker)
    ha.cluster.wait_workers()
