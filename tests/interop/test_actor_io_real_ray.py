"""The actor scheduler's I/O against real Ray 2.60 raylets and core workers.

Until ``gcs serve --head`` runs unmodified Ray workers, a cluster with Ray's own GCS stands
in: a driver creates a named detached actor; we read its creation TaskSpec from Ray's GCS
(``GetNamedActorInfo``, our messages on Ray's wire), then do what our actor scheduler does
with it: ``RequestWorkerLease`` at the real raylet (the LeaseSpec we build), ``PushTask`` of
the creation task to the leased core worker (a second incarnation starts and answers), and
``KillLocalActor`` (that worker process exits).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

import grpc
import pytest

from gcs.base.errors import GcsError
from gcs.managers.actors.scheduler import lease_request, leased_worker
from gcs.proto import core_worker_pb2, node_manager_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.rpc.raylet_io.actors import GrpcActorGateway
from gcs.rpc.raylet_io.budget import RayletIoBudget
from gcs.rpc.raylet_io.grpc_gateway import GrpcRayletGateway
from gcs.testing.ports import free_port
from tests.conftest import eventually
from tests.interop.ray_processes import NO_LOG_MONITOR, process_exit, ray_env, stop_group

pytestmark = [pytest.mark.interop, pytest.mark.slow]

HOST = "127.0.0.2"
DRIVER = """
import sys, ray
ray.init(address=sys.argv[1], namespace="io", logging_level="ERROR")
@ray.remote(num_cpus=1)
class Probe:
    def __init__(self):
        self.n = 0
    def ping(self):
        self.n += 1
        return self.n
p = Probe.options(name="probe", lifetime="detached").remote()
assert ray.get(p.ping.remote(), timeout=300) == 1
print("ok")
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    return False


@pytest.mark.parametrize("transport", ["h2", "grpc"])
async def test_lease_push_and_kill_on_real_raylet_and_worker(
    ray_venv, tmp_path: Path, transport: str
) -> None:
    """Over the raylet gateway's transport: the lean HTTP/2 client (the lease without a
    deadline, as the scheduler asks it) or grpc.aio."""
    ray_bin = Path(ray_venv.python).parent / "ray"
    port = free_port()
    address = f"{HOST}:{port}"
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    env = ray_env(ray_tmp / "env")  # own HOME and TMPDIR, RAY_AUTH_MODE explicit
    head_log = (tmp_path / "head.log").open("wb")
    head = await asyncio.create_subprocess_exec(
        str(ray_bin), "start", "--head", "--block", f"--node-ip-address={HOST}",
        f"--port={port}", "--num-cpus=3", "--include-dashboard=false", f"--temp-dir={ray_tmp}",
        NO_LOG_MONITOR,
        stdout=head_log, stderr=asyncio.subprocess.STDOUT, env=env,
        start_new_session=True,
    )  # fmt: skip
    raylets = GrpcRayletGateway(RayletIoBudget(4, 4, 0), poll_transport=transport)
    pool = raylets.pool
    gateway = GrpcActorGateway(pool, gateway=raylets)
    channel = grpc.aio.insecure_channel(address)
    pid = 0
    try:
        stubs = None

        async def gcs_up() -> bool:
            nonlocal stubs
            if head.returncode is not None:
                return True
            try:
                reply = await ServiceStub(channel, svc.NODE_INFO, timeout_s=2).GetClusterId(
                    G.GetClusterIdRequest()
                )
            except grpc.aio.AioRpcError:
                return False
            md = [("ray_cluster_id", reply.cluster_id.hex())]
            stubs = (
                ServiceStub(channel, svc.ACTOR_INFO, metadata=md, timeout_s=10),
                ServiceStub(channel, svc.NODE_INFO, metadata=md, timeout_s=10),
            )
            return True

        # wall clock: Ray's own GCS answering is the only readiness signal `ray start` gives
        await eventually(gcs_up, timeout_s=120, interval_s=0.5)
        assert head.returncode is None and stubs is not None, (tmp_path / "head.log").read_text()[
            -3000:
        ]
        actors, nodes = stubs
        driver = await asyncio.create_subprocess_exec(
            str(ray_venv.python), "-c", DRIVER, address,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await asyncio.wait_for(driver.communicate(), timeout=600)
        assert driver.returncode == 0 and b"ok" in out, err.decode()[-3000:]

        named = await actors.GetNamedActorInfo(
            G.GetNamedActorInfoRequest(name="probe", ray_namespace="io")
        )
        assert named.status.code == 0, named.status
        spec = named.task_spec
        assert spec.actor_creation_task_spec.actor_id == named.actor_table_data.actor_id
        (node,) = (await nodes.GetAllNodeInfo(G.GetAllNodeInfoRequest())).node_info_list
        raylet = f"{node.node_manager_address}:{node.node_manager_port}"

        lease = await asyncio.wait_for(
            gateway.request_worker_lease(node.node_id, raylet, lease_request(spec), None), 300
        )
        assert lease.worker_address.port > 0, lease
        assert not lease.rejected and not lease.canceled
        worker = leased_worker(lease, node.node_id, raylet)
        assert worker.ip_address == HOST and worker.node_id == node.node_id
        assert worker.worker_id != named.actor_table_data.address.worker_id
        pid = lease.worker_pid
        assert pid > 0 and _alive(pid)

        pushed = await asyncio.wait_for(
            gateway.push_task(
                worker,
                core_worker_pb2.PushTaskRequest(
                    intended_worker_id=worker.worker_id,
                    task_spec=spec,
                    resource_mapping=lease.resource_mapping,
                ),
            ),
            timeout=300,
        )
        assert not pushed.is_application_error, pushed.task_execution_error

        kill = node_manager_pb2.KillLocalActorRequest(
            intended_actor_id=spec.actor_creation_task_spec.actor_id,
            worker_id=worker.worker_id,
            force_kill=True,
        )
        kill.death_cause.actor_died_error_context.error_message = "killed by the test"
        # A force-killed worker exits before answering the raylet, which then reports the
        # forwarded call as failed (unreachable, or its own ABORTED status naming the closed
        # socket): the manager treats this call as best effort too (any GcsError).
        with contextlib.suppress(GcsError):
            await gateway.kill_local_actor(node.node_id, raylet, kill, timeout_s=30)
        await process_exit(pid, timeout_s=60)
        assert not raylets.grpc_only  # no fallback: the lean client spoke to both
    finally:
        await channel.close()
        await gateway.close()
        await raylets.close()
        await stop_group(head)
        if pid and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        head_log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
