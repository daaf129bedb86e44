"""End to end on the fake Kubernetes: a real GCS, the autoscaler runtime with the KubeRay
provider on the real ``kubernetes`` client, and a real ``gcs raylet --instance-id <pod>
--node-type <group>`` agent standing in for each pod the fake operator creates.

Pending demand ({CPU: 2} on a 1-CPU worker) resizes the pod in place, the raylet's totals
grow in GetClusterResourceState, the work runs there (no new pod); with ``downsize`` on the
idle extra capacity is then given back.  The autoscaler's rounds run on a clock the test
moves; raylets registering are events the GCS publishes; one wait is on wall time, with its
reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gcs.autoscaler.providers.kuberay.k8s import KubernetesApi
from gcs.autoscaler.providers.kuberay.provider import initial_config
from gcs.autoscaler.runtime import AutoscalerRuntime
from gcs.policy.autoscaling.model import InstanceStatus, NodeKind
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from gcs.testing.fake_k8s import FakeKubernetes
from tests.autoscaler.clock import SteppedClock
from tests.autoscaler.driving import NodeWatch, Rounds
from tests.autoscaler.kuberay_harness import GI, raycluster, worker_group
from tests.conftest import eventually, fast_config

pytestmark = pytest.mark.slow

IPPR = {
    "small-group": {
        "max-cpu": "4",
        "max-memory": "4Gi",
        "resize-timeout": 30,
        "downsize": True,
    }
}


class PodRaylets:
    """One ``gcs raylet`` process per pod, started and stopped as the fake operator acts."""

    def __init__(self, gcs_address: str, log_dir: Path) -> None:
        self.gcs_address = gcs_address
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def created(self, pod: dict[str, Any]) -> None:
        labels = pod["metadata"]["labels"]
        name = pod["metadata"]["name"]
        head = labels["ray.io/node-type"] == "head"
        res = {"CPU": 0} if head else {"CPU": 1, "memory": GI}
        cmd = [
            sys.executable, "-m", "gcs", "raylet", "--address", self.gcs_address,
            "--resources", json.dumps(res), "--node-type", labels["ray.io/group"],
            "--instance-id", name, "--node-name", name, "--host", "127.0.0.1",
        ]  # fmt: skip
        if head:
            cmd.append("--head")
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - owned by the process
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def deleted(self, pod: dict[str, Any]) -> None:
        self._stop(pod["metadata"]["name"])

    def _stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    async def stop_all(self) -> None:
        """Off the event loop: a stopping raylet unregisters with the GCS, which must be
        free to answer (a blocking wait here held every raylet for its RPC deadline)."""
        await asyncio.gather(*(asyncio.to_thread(self._stop, name) for name in list(self.procs)))


async def test_pending_demand_resizes_a_pod_in_place_then_gives_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = GcsServer(fast_config(), store=MemoryStore())
    await server.start()
    k8s = FakeKubernetes().start()
    raylets = PodRaylets(server.address, tmp_path)
    k8s.on_pod_created = raylets.created
    k8s.on_pod_deleted = raylets.deleted
    rt = None
    submit = None
    watch = await NodeWatch(server.address).start()
    try:
        k8s.add_raycluster(
            raycluster(
                worker_group(replicas=1, min_replicas=1, max_replicas=3),
                ippr=IPPR,
                idle_timeout_s=3,
            )
        )
        (pod,) = k8s.pod_names("small-group")
        # the provider's registry row builds its client from the config the RayCluster
        # gave (its name and namespace) and the credentials, as in a pod
        monkeypatch.setenv("KUBECONFIG", str(k8s.write_kubeconfig(tmp_path / "kubeconfig")))
        cfg = client.Configuration()
        cfg.host = k8s.url
        api = KubernetesApi(client.ApiClient(cfg), "default", "raycluster-ippr")
        clock = SteppedClock()
        rt = AutoscalerRuntime(
            await initial_config(api),
            server.address,
            state_dir=tmp_path / "provider",
            store=server.store,
            clock=clock,
            interval_s=1.0,
        )
        rounds = Rounds(rt, clock)
        await rounds.first()

        async def totals() -> dict[str, float]:
            state = await rt.gcs.get_cluster_resource_state()
            for ns in state.node_states:
                if ns.instance_id == pod:
                    return dict(ns.total_resources)
            return {}

        async def cpu_is(value: float) -> bool:
            return (await totals()).get("CPU") == value

        await watch.until(lambda w: len(w.alive) == 2)  # the head's and the worker's raylets
        assert await cpu_is(1)
        submit = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gcs", "submit", "--address", server.address,
            "--resources", '{"CPU": 2}', "--count", "1", "--seconds", "4",
            "--timeout", "120", "--format", "json",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip

        async def demand_shown() -> bool:
            state = await rt.gcs.get_cluster_resource_state()
            return sum(r.count for r in state.pending_resource_requests) > 0

        # wall clock: a real process (gcs submit) must start and queue its lease
        await eventually(demand_shown, timeout_s=120)
        # the pod grows in place (the kubelet applies it), then the raylet follows
        await rounds.until(lambda: cpu_is(4))
        size = k8s.pod(pod)["status"]["containerStatuses"][0]["resources"]["limits"]
        assert size == {"cpu": "4", "memory": str(4 * GI)}
        assert (await totals())["memory"] == 4 * GI
        out, _ = await asyncio.wait_for(submit.communicate(), timeout=150)
        assert submit.returncode == 0, out
        result = json.loads(out.decode().strip().splitlines()[-1])
        # infeasible when submitted (no 2-CPU node), granted once the pod grew
        assert result["granted"] == 1 and result["queued"] == 0, result
        assert k8s.pod_names("small-group") == [pod]  # resized, never scaled out

        async def given_back() -> bool:
            limits = k8s.pod(pod)["status"]["containerStatuses"][0]["resources"]["limits"]
            return await cpu_is(1) and limits["cpu"] == "1"

        # idle past the timeout (on the autoscaler's clock, from when the raylet's report
        # shows it idle): the extra capacity goes back, raylet first, then the pod
        await rounds.until(given_back, max_rounds=300)
        status = json.loads(k8s.pod(pod)["metadata"]["annotations"]["ray.io/ippr-status"])
        assert status["last-failed-at"] is None
        assert rt.reconciler.failed_rounds == 0, rt.reconciler.last_error
        (head,) = [i for i in rt.instances.instances.values() if i.instance_type == "headgroup"]
        assert head.node_kind is NodeKind.HEAD and head.status is InstanceStatus.RAY_RUNNING
    finally:
        if submit is not None and submit.returncode is None:
            submit.kill()
            await submit.wait()
        if rt is not None:
            await rt.close()
        await watch.close()
        await raylets.stop_all()
        k8s.stop()
        await server.stop()
