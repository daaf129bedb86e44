"""``gcs autoscaler run --provider kuberay``: credentials from KUBECONFIG, one-line errors,
and a real run against the fake API server and a real GCS."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from gcs.autoscaler.grpc_gcs import GrpcAutoscalerGcs
from gcs.sdk import request_resources_async
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from gcs.testing.fake_k8s import FakeKubernetes
from tests.autoscaler.kuberay_harness import raycluster, worker_group
from tests.autoscaler.test_kuberay_end_to_end import PodRaylets
from tests.cli.test_error_paths import _env, assert_one_line_error
from tests.conftest import fast_config
from tests.forked_cli import ForkedCli

NAME = "raycluster-ippr"


@pytest.fixture
def fake(tmp_path: Path):  # type: ignore[no-untyped-def]
    k8s = FakeKubernetes().start()
    yield k8s, str(k8s.write_kubeconfig(tmp_path / "kubeconfig"))
    k8s.stop()


def test_needs_a_cluster_name(gcs_cli: ForkedCli) -> None:
    argv = ["autoscaler", "run", "--address", "127.0.0.1:1", "--provider", "kuberay"]
    result = gcs_cli.run(argv, env=_env())
    assert "--cluster-name" in assert_one_line_error(result, 2)


def test_without_credentials_says_so(gcs_cli: ForkedCli, tmp_path: Path) -> None:
    env = _env(KUBECONFIG=str(tmp_path / "missing"), HOME=str(tmp_path))
    result = gcs_cli.run(["autoscaler", "run", "--address", "127.0.0.1:1", "--provider",
                          "kuberay", "--cluster-name", NAME], env=env)  # fmt: skip
    assert "cannot load Kubernetes credentials" in assert_one_line_error(result, 1)


def test_missing_raycluster_is_named(gcs_cli: ForkedCli, fake) -> None:  # type: ignore[no-untyped-def]
    _, kubeconfig = fake
    result = gcs_cli.run(["autoscaler", "run", "--address", "127.0.0.1:1", "--provider",
                          "kuberay", "--cluster-name", "nope"],
                         env=_env(KUBECONFIG=kubeconfig))  # fmt: skip
    line = assert_one_line_error(result, 1)
    assert "RayCluster default/nope" in line and "not found" in line


async def test_live_drivers_against_a_real_gcs() -> None:
    server = GcsServer(fast_config(), store=MemoryStore())
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            assert await GrpcAutoscalerGcs(channel).live_drivers() == 0
    finally:
        await server.stop()


def _spawn_autoscaler(address: str, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gcs", "autoscaler", "run", "--gcs-address", address,
             "--provider", "kuberay", "--cluster-name", NAME, "--cluster-namespace", "default"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


@pytest.mark.slow
async def test_run_scales_the_raycluster_to_what_is_requested(fake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The sidecar command against a real GCS: once the head pod's raylet runs, a
    ``request_resources`` for two workers' worth makes it patch the RayCluster's replicas,
    and the operator creates the pods (an event the test waits on)."""
    k8s, kubeconfig = fake
    server = GcsServer(fast_config(), store=MemoryStore())
    await server.start()
    raylets = PodRaylets(server.address, tmp_path)
    loop = asyncio.get_running_loop()
    two_workers = asyncio.Event()

    def created(pod: dict[str, Any]) -> None:  # the fake's HTTP thread
        raylets.created(pod)
        if len(k8s.pod_names("small-group")) >= 2:
            loop.call_soon_threadsafe(two_workers.set)

    k8s.on_pod_created = created
    k8s.on_pod_deleted = raylets.deleted
    proc = None
    try:
        k8s.add_raycluster(raycluster(worker_group(replicas=0, min_replicas=0)))
        env = _env(KUBECONFIG=kubeconfig, AUTOSCALER_UPDATE_INTERVAL_S="0.3")
        proc = _spawn_autoscaler(server.address, env, tmp_path / "autoscaler.log")
        await request_resources_async(bundles=[{"CPU": 1}, {"CPU": 1}], address=server.address)
        # bounds a hang only: the autoscaler process and the head's raylet must start
        await asyncio.wait_for(two_workers.wait(), timeout=180)
        spec = k8s.raycluster(NAME)["spec"]["workerGroupSpecs"][0]
        assert spec["replicas"] == 2 and len(k8s.pod_names("small-group")) == 2
        assert proc.poll() is None, (tmp_path / "autoscaler.log").read_text()
        text = (tmp_path / "autoscaler.log").read_text()
        assert "provider kuberay" in text, text
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        await raylets.stop_all()
        await server.stop()
    assert json.loads(json.dumps(k8s.raycluster(NAME)))  # still readable after stop
