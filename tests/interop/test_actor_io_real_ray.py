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
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
from tests.interop.ray_processes import NO_LOG_MONITOR, process_exit, ray_env
from tests.interop.real_cluster import kill_group, poll_pauses

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


@dataclass(frozen=True)
class RayHead:
    """``ray start --head`` (Ray's own GCS) with the driver's detached ``probe`` actor."""

    address: str
    log: Path


def _cluster_id(address: str) -> bytes | None:
    """Ray's GCS's cluster id once it answers (a blocking probe between polls)."""
    with grpc.insecure_channel(address) as channel:
        stub = ServiceStub(channel, svc.NODE_INFO, timeout_s=2)  # type: ignore[arg-type]
        try:
            return bytes(stub.GetClusterId(G.GetClusterIdRequest()).cluster_id)
        except grpc.RpcError:
            return None


@pytest.fixture(scope="module")
def ray_head(ray_venv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    """One head for both transports (each test leases, pushes and kills an incarnation of
    its own: the probe actor itself lives on); a head and its driver per test cost ~12 CPU s
    more."""
    ray_bin = Path(ray_venv.python).parent / "ray"
    address = f"{HOST}:{free_port()}"
    port = address.rsplit(":", 1)[1]
    # Ray's AF_UNIX socket paths must stay under 107 bytes: a short temp dir of its own.
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    env = ray_env(ray_tmp / "env")  # own HOME and TMPDIR, RAY_AUTH_MODE explicit
    log = tmp_path_factory.mktemp("head") / "head.log"
    with log.open("wb") as out:
        head = subprocess.Popen(
            [
                str(ray_bin), "start", "--head", "--block", f"--node-ip-address={HOST}",
                f"--port={port}", "--num-cpus=3", "--include-dashboard=false",
                f"--temp-dir={ray_tmp}", NO_LOG_MONITOR,
            ],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        # wall clock: Ray's own GCS answering is the only readiness signal `ray start` gives
        deadline = time.monotonic() + 120
        for pause in poll_pauses():
            if head.poll() is not None or _cluster_id(address) is not None:
                break
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(pause)
        assert head.poll() is None, log.read_text()[-3000:]
        driver = subprocess.run(
            [str(ray_venv.python), "-c", DRIVER, address],
            capture_output=True, env=env, timeout=600, check=False,
        )  # fmt: skip
        assert driver.returncode == 0 and b"ok" in driver.stdout, driver.stderr[-3000:]
        yield RayHead(address, log)
    finally:
        kill_group(head)
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.parametrize("transport", ["h2", "grpc"])
async def test_lease_push_and_kill_on_real_raylet_and_worker(
    ray_head: RayHead, transport: str
) -> None:
    """Over the raylet gateway's transport: the lean HTTP/2 client (the lease without a
    deadline, as the scheduler asks it) or grpc.aio."""
    address = ray_head.address
    raylets = GrpcRayletGateway(RayletIoBudget(4, 4, 0), poll_transport=transport)
    pool = raylets.pool
    gateway = GrpcActorGateway(pool, gateway=raylets)
    channel = grpc.aio.insecure_channel(address)
    pid = 0
    try:
        cluster_id = _cluster_id(address)
        assert cluster_id is not None, ray_head.log.read_text()[-3000:]
        md = [("ray_cluster_id", cluster_id.hex())]
        actors = ServiceStub(channel, svc.ACTOR_INFO, metadata=md, timeout_s=10)
        nodes = ServiceStub(channel, svc.NODE_INFO, metadata=md, timeout_s=10)
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
        if pid and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
