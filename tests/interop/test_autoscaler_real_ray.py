"""The standalone autoscaler against a real Ray 2.60 cluster.

``ray start --head`` (Ray's own GCS) on 127.0.0.2; our autoscaler runs with the ``command``
provider whose start command is a real ``ray start --address ... --block`` worker.  Real
pending Ray tasks make it launch a worker, the tasks finish there, and the idle worker is
drained by Ray's raylet and stopped.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.runtime import AutoscalerRuntime
from gcs.policy.autoscaling.scheduler.types import InstanceStatus as S
from gcs.policy.autoscaling.scheduler.types import NodeKind
from gcs.rpc.security import Security
from gcs.testing.ports import free_port
from tests.conftest import eventually
from tests.interop.ray_processes import NO_LOG_MONITOR, env_prefix, ray_env, stop_group

pytestmark = [pytest.mark.interop, pytest.mark.slow]

HOST = "127.0.0.2"

DRIVER = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
@ray.remote(num_cpus=1)
def work(i):
    time.sleep(2)
    return ray.get_runtime_context().get_node_id()
nodes = ray.get([work.remote(i) for i in range(4)], timeout=600)
print(json.dumps({"nodes": sorted(set(nodes))}))
"""


async def test_pending_ray_tasks_launch_a_worker_that_drains_when_idle(
    ray_venv, tmp_path: Path
) -> None:
    ray_bin = Path(ray_venv.python).parent / "ray"
    port = free_port()
    address = f"{HOST}:{port}"
    # Ray's AF_UNIX socket paths must stay under 107 bytes: a short temp dir of its own.
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    env = ray_env(ray_tmp / "env")  # own HOME and TMPDIR, RAY_AUTH_MODE explicit
    head_log = (tmp_path / "head.log").open("wb")
    head = await asyncio.create_subprocess_exec(
        str(ray_bin), "start", "--head", "--block", f"--node-ip-address={HOST}",
        f"--port={port}", "--num-cpus=0", "--include-dashboard=false", f"--temp-dir={ray_tmp}",
        NO_LOG_MONITOR,
        # not Ray's fixed 10001: another head on this machine would take it, and --block
        # stops the whole head when its client server dies
        f"--ray-client-server-port={free_port()}",
        stdout=head_log, stderr=asyncio.subprocess.STDOUT, env=env,
        start_new_session=True,
    )  # fmt: skip
    cluster = parse_cluster_config(
        {
            "cluster_name": "interop",
            "max_workers": 2,
            "upscaling_speed": 1,
            "provider": {"type": "command"},
            "head_node_type": "head",
            "available_node_types": {
                "head": {"resources": {"CPU": 0}, "max_workers": 0},
                "cpu2": {
                    "resources": {"CPU": 2},
                    "max_workers": 2,
                    "idle_timeout_s": 5,
                    "node_config": {
                        "start_command": f"{env_prefix(env)} "
                        f"{ray_bin} start --address {{gcs_address}} --block "
                        f"--node-ip-address={HOST} --num-cpus=2 "
                        f"--temp-dir={ray_tmp}",
                    },
                },
            },
        }
    )
    runtime = AutoscalerRuntime(
        cluster, address, state_dir=tmp_path / "provider", interval_s=1.0, security=Security()
    )
    driver = None
    try:
        # wall clock: Ray's own GCS answering is the only readiness signal `ray start` gives
        await eventually(
            lambda: head.returncode is not None or _gcs_up(address), timeout_s=120, interval_s=0.5
        )
        assert head.returncode is None, (tmp_path / "head.log").read_text()[-3000:]
        await runtime.start()
        driver = await asyncio.create_subprocess_exec(
            str(ray_venv.python), "-c", DRIVER, address,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        _, err = await asyncio.wait_for(driver.communicate(), timeout=600)
        assert driver.returncode == 0, err.decode()[-3000:]
        workers = [
            i for i in runtime.instances.instances.values() if i.node_kind is NodeKind.WORKER
        ]
        assert workers, "no worker was launched for the pending tasks"
        assert any(i.status is S.RAY_RUNNING or i.node_id for i in workers)
        # the worker goes idle, Ray's raylet accepts the idle drain and exits, we stop it
        # (wall clock: the real raylet's idle time and exit, read through the runtime's loop)
        await eventually(
            lambda: all(
                i.status in (S.TERMINATED, S.TERMINATING)
                for i in runtime.instances.instances.values()
                if i.node_kind is NodeKind.WORKER
            ),
            timeout_s=300,
            interval_s=0.5,
        )
        kinds = [e.kind for e in runtime.events.recent(100)]
        assert "launch" in kinds and "drain" in kinds

        async def no_worker_left() -> bool:
            return not await runtime.provider.get_non_terminated()

        # wall clock: the command provider's stop of a real `ray start` process
        await eventually(no_worker_left, timeout_s=60, interval_s=0.5)
        assert not [e for e in runtime.events.recent(100) if e.kind.endswith("failed")]
    finally:
        if driver is not None and driver.returncode is None:
            driver.kill()
            await driver.wait()
        await runtime.shutdown_cluster()
        await runtime.stop()
        await stop_group(head)
        head_log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _gcs_up(address: str) -> bool:
    """Ray's GCS answers GetClusterId (a blocking probe: this runs between polls)."""
    import grpc

    from gcs.proto import gcs_service_pb2

    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            "/ray.rpc.NodeInfoGcsService/GetClusterId",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=gcs_service_pb2.GetClusterIdReply.FromString,
        )
        try:
            call(gcs_service_pb2.GetClusterIdRequest(), timeout=2)
        except grpc.RpcError:
            return False
        return True
