"""Actors of an unmodified Ray 2.60 cluster on our GCS (issue 10 "must show").

``gcs serve --head`` on 127.0.0.2, two ``ray start --address`` worker nodes and a
``ray.init`` driver: a named detached actor (found by name from another handle, its name
refused to a second actor), its restart after its worker is killed with SIGKILL
(``max_restarts=1``), then ``ray.kill`` (dead for good, the name freed).

Needs ``gcs serve --head`` (helper realray's branch); skipped with that reason until then.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gcs.testing.servers import free_port
from tests.interop.ray_processes import ray_env, stop_group

pytestmark = [pytest.mark.interop, pytest.mark.slow]

HOST = "127.0.0.2"
DRIVER = """
import json, os, signal, sys, time, ray
from ray.exceptions import RayActorError
ray.init(address=sys.argv[1], namespace="app", logging_level="ERROR")

@ray.remote(num_cpus=1, max_restarts=1, max_task_retries=-1)
class Keeper:
    def pid(self):
        return os.getpid()
    def node(self):
        return ray.get_runtime_context().get_node_id()

out = {}
keeper = Keeper.options(name="keeper", lifetime="detached").remote()
first = ray.get(keeper.pid.remote(), timeout=300)
out["same_by_name"] = ray.get(ray.get_actor("keeper").pid.remote(), timeout=60) == first
try:
    ray.get(Keeper.options(name="keeper", lifetime="detached").remote().pid.remote(), timeout=60)
    out["conflict"] = "none"
except ValueError as err:
    out["conflict"] = str(err)
os.kill(first, signal.SIGKILL)
deadline = time.time() + 300
second = first
while second == first and time.time() < deadline:
    try:
        second = ray.get(keeper.pid.remote(), timeout=60)
    except RayActorError:
        time.sleep(0.5)
out["restarted"] = second != first
ray.kill(keeper)
try:
    ray.get(keeper.pid.remote(), timeout=60)
    out["after_kill"] = "alive"
except RayActorError:
    out["after_kill"] = "dead"
try:
    ray.get_actor("keeper")
    out["name_after_kill"] = "taken"
except ValueError:
    out["name_after_kill"] = "free"
print(json.dumps(out))
"""


def _head_supported() -> bool:
    help_text = subprocess.run(
        [sys.executable, "-m", "gcs.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return "--head" in help_text


async def test_named_detached_actor_restart_and_kill(ray_venv, tmp_path: Path) -> None:
    if not _head_supported():
        pytest.skip("needs `gcs serve --head` (realray's branch) to run real Ray workers")
    ray_bin = Path(ray_venv.python).parent / "ray"
    port = free_port()
    address = f"{HOST}:{port}"
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    procs: list[asyncio.subprocess.Process] = []
    logs = []

    async def spawn(name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = (tmp_path / f"{name}.log").open("wb")
        logs.append(log)
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True
        )
        procs.append(proc)

    try:
        await spawn(
            "gcs", sys.executable, "-m", "gcs.cli", "serve", "--head", "--host", HOST,
            "--port", str(port), "--storage", f"sqlite:///{tmp_path / 'gcs.db'}",
            "--metrics-port", "-1",
        )  # fmt: skip
        for n in range(2):
            await spawn(
                f"worker{n}", str(ray_bin), "start", f"--address={address}", "--block",
                f"--node-ip-address={HOST}", "--num-cpus=2", f"--temp-dir={ray_tmp}",
                env=ray_env(),
            )  # fmt: skip
        driver = await asyncio.create_subprocess_exec(
            str(ray_venv.python), "-c", DRIVER, address,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ray_env(),
        )  # fmt: skip
        out, err = await asyncio.wait_for(driver.communicate(), timeout=900)
        assert driver.returncode == 0, err.decode()[-3000:]
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["same_by_name"] is True
        assert "already exists" in result["conflict"], result
        assert result["restarted"] is True
        assert result["after_kill"] == "dead"
        assert result["name_after_kill"] == "free"
    finally:
        for proc in reversed(procs):
            await stop_group(proc)
        for log in logs:
            log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
