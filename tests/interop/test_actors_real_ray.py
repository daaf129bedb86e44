"""Actors of an unmodified Ray 2.60 cluster on our GCS (issue 10 "must show").

Our ``gcs serve`` on 127.0.0.2, a real ``ray start --address`` worker node and ``ray.init``
drivers: a named detached actor (found by name from another handle, its name refused to a
second actor), its restart after its worker is killed with SIGKILL (``max_restarts=1``), a
job-scoped actor whose worker goes when the driver's job ends;
then our GCS is killed with SIGKILL and restarted on the same store: a new driver finds the
actor by name with its state intact, and ``ray.kill`` ends it (its name free again).

Head: ``gcs serve --head`` once it exists (helper realray's branch); until then our raylet
agent registers as the head node and ``CLUSTER_METADATA`` gets the full Python version (the
two things ``ray start --address`` needs, issue 10).  The restart step needs
``WorkerInfoGcsService.ReportWorkerFailure`` (also realray's): it is checked only when the
GCS serves that service.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gcs.testing.ports import free_port
from tests.conftest import eventually
from tests.interop.ray_processes import (
    NO_LOG_MONITOR,
    our_env,
    process_exit,
    ray_env,
    set_full_python_version,
    stop_groups,
)

pytestmark = [pytest.mark.interop, pytest.mark.slow]

HOST = "127.0.0.2"
DRIVER_BEFORE = """
import json, os, signal, sys, time, ray
from ray.exceptions import RayActorError
ray.init(address=sys.argv[1], namespace="app", logging_level="ERROR")
check_restart = sys.argv[2] == "1"

@ray.remote(num_cpus=1, max_restarts=1, max_task_retries=-1)
class Keeper:
    def __init__(self):
        self.n = 0
    def incr(self):
        self.n += 1
        return self.n, os.getpid()

out = {}
scoped = Keeper.remote()  # job-scoped: dies when this driver's job ends
out["scoped_pid"] = ray.get(scoped.incr.remote(), timeout=300)[1]
keeper = Keeper.options(name="keeper", lifetime="detached").remote()
n, first = ray.get(keeper.incr.remote(), timeout=300)
out["same_by_name"] = ray.get(ray.get_actor("keeper").incr.remote(), timeout=60) == (2, first)
try:
    ray.get(Keeper.options(name="keeper", lifetime="detached").remote().incr.remote(), timeout=60)
    out["conflict"] = "none"
except ValueError as err:
    out["conflict"] = str(err)
if check_restart:
    os.kill(first, signal.SIGKILL)
    n, second = ray.get(keeper.incr.remote(), timeout=300)
    out["restarted"] = second != first and n == 1
print(json.dumps(out))
"""
DRIVER_AFTER = """
import json, sys, time, ray
from ray.exceptions import RayActorError
ray.init(address=sys.argv[1], namespace="app", logging_level="ERROR")
out = {}
keeper = ray.get_actor("keeper")
out["count_after_gcs_restart"] = ray.get(keeper.incr.remote(), timeout=120)[0]
# ray.kill is asynchronous in Ray 2.60 (the core worker does not wait for the GCS): a call
# made right after it may still run; the death shows within a bounded time.
ray.kill(keeper)
out["after_kill"] = "alive"
deadline = time.time() + 60
while time.time() < deadline:
    try:
        ray.get(keeper.incr.remote(), timeout=60)
    except RayActorError as err:
        out["after_kill"] = str(err)
        break
    time.sleep(0.2)
out["name_after_kill"] = "taken"
while time.time() < deadline:
    try:
        ray.get_actor("keeper")
    except ValueError:
        out["name_after_kill"] = "free"
        break
    time.sleep(0.2)
print(json.dumps(out))
"""


def _head_supported() -> bool:
    help_text = subprocess.run(
        [sys.executable, "-m", "gcs.cli.main", "serve", "--help"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return "--head" in help_text


async def _serves(channel: grpc.aio.Channel, service: str) -> bool:
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    except grpc.aio.AioRpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def test_named_detached_actor_restart_and_kill(ray_venv, tmp_path: Path) -> None:
    ray_bin = Path(ray_venv.python).parent / "ray"
    port = free_port()
    address = f"{HOST}:{port}"
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    env = ray_env(ray_tmp / "env")  # own HOME and TMPDIR, RAY_AUTH_MODE explicit
    procs: list[asyncio.subprocess.Process] = []
    logs = []

    async def spawn(name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = (tmp_path / f"{name}.log").open("wb")
        logs.append(log)
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True
        )
        procs.append(proc)

    channel = grpc.aio.insecure_channel(address)
    head = ["--head"] if _head_supported() else []
    serve = (
        sys.executable, "-m", "gcs.cli.main", "serve", *head, "--host", HOST, "--port", str(port),
        "--storage", f"sqlite:///{tmp_path / 'gcs.db'}", "--metrics-port", "-1",
    )  # fmt: skip

    async def driver(script: str, *args: str) -> dict[str, object]:
        proc = await asyncio.create_subprocess_exec(
            str(ray_venv.python), "-c", script, address, *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), timeout=900)
        assert proc.returncode == 0, err.decode()[-3000:]
        result: dict[str, object] = json.loads(out.decode().strip().splitlines()[-1])
        return result

    try:
        await spawn("gcs", *serve, env=our_env(env))
        # wall clock: our GCS's port answering is the only readiness signal it gives
        await eventually(lambda: _serves(channel, ""), timeout_s=60, interval_s=0.2)
        if not head:
            await spawn(
                "agent-head", sys.executable, "-m", "gcs.cli.main", "raylet", "--address", address,
                "--head", "--host", HOST, "--resources", '{"CPU": 0}',
            )  # fmt: skip
            await set_full_python_version(address, str(ray_venv.python))
        await spawn(
            "worker", str(ray_bin), "start", f"--address={address}", "--block",
            f"--node-ip-address={HOST}", "--num-cpus=2", f"--temp-dir={ray_tmp}", NO_LOG_MONITOR,
            env=env,
        )  # fmt: skip
        restart = await _serves(channel, "ray.rpc.WorkerInfoGcsService")
        before = await driver(DRIVER_BEFORE, "1" if restart else "0")
        assert before["same_by_name"] is True
        conflict = str(before["conflict"])
        assert "keeper" in conflict and "already taken" in conflict, before
        if restart:
            assert before["restarted"] is True
        scoped_pid = before["scoped_pid"]
        assert isinstance(scoped_pid, int)
        await process_exit(scoped_pid, timeout_s=60)

        gcs = procs[0]  # kill -9 our GCS; the same store and port bring it back
        gcs.kill()
        await gcs.wait()
        await spawn("gcs-restarted", *serve, env=our_env(env))
        # wall clock: as above, the restarted GCS serving
        await eventually(lambda: _serves(channel, ""), timeout_s=60, interval_s=0.2)
        after = await driver(DRIVER_AFTER)
        # the detached actor kept its state: 2 calls (or 1 after its restart) then this one
        assert after["count_after_gcs_restart"] == (2 if restart else 3), after
        assert "killed by `ray.kill`" in str(after["after_kill"]), after
        assert after["name_after_kill"] == "free"
    finally:
        await channel.close()
        await stop_groups(procs)
        for log in logs:
            log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
