"""A real Ray 2.60 cluster on our GCS: ``gcs serve --head`` + unmodified ``ray start``.

Our GCS runs as ``gcs serve --head`` on 127.0.0.2; two real worker nodes join it with
``ray start --address`` (127.0.0.2 and 127.0.0.3, Ray's wheel in its own venv), and driver
subprocesses use ``ray.init(address=...)``.  Ray's raylets learn each other's resources
through our syncer hub, so work spreads over both nodes; raylets start a job's workers once
the job is published on GCS_JOB.  Every process is started in its own process group and
killed by group at the end (``ray stop`` would not find raylets under private temp dirs).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from tests.interop import venvs
from tests.interop.real_cluster import RealCluster, Worker, real_cluster

pytestmark = [pytest.mark.interop, pytest.mark.slow]

WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")

DRIVER = textwrap.dedent(
    """
    import collections, json, sys, time, ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=sys.argv[1], logging_level="ERROR")
    me = ray.get_runtime_context().get_node_id()

    @ray.remote(num_cpus=1)
    def where(i):
        # 100 of them take the driver's node 15 s alone: longer than the other node's cold
        # worker start, so the tasks spilled back to it run there
        time.sleep(0.3)
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


@pytest.fixture(scope="module")
def cluster(ray_venv: venvs.Venv) -> Iterator[RealCluster]:
    with real_cluster(ray_venv, workers=[Worker(host) for host in WORKER_HOSTS]) as c:
        yield c


@pytest.fixture(scope="module")
def job(cluster: RealCluster) -> dict[str, Any]:
    """The driver's job, run once for the module: what it printed."""
    return cluster.driver(DRIVER)


def test_tasks_spread_over_both_workers_spread_and_node_affinity(job: dict[str, Any]) -> None:
    """100 tasks run on both nodes, SPREAD uses both, a hard NodeAffinity to the node the
    driver is not on runs there (each needs the raylets to see each other's resources)."""
    out = job
    assert len(out["alive"]) == 2, out
    assert sum(out["plain"].values()) == 100
    assert set(out["plain"]) == set(out["alive"]), f"every node runs some: {out['plain']}"
    assert set(out["spread"]) == set(out["alive"]), f"SPREAD uses both: {out['spread']}"
    assert out["pinned"] == out["other"] != out["me"]


def test_ray_status_shows_both_workers(cluster: RealCluster) -> None:
    done = cluster.run([str(cluster.ray_bin), "status", "--address", cluster.address], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(" node_") == 2, done.stdout
    assert "/4.0 CPU" in done.stdout, done.stdout


@pytest.mark.usefixtures("job")
def test_no_process_logs_unimplemented_worker_or_task_rpcs(cluster: RealCluster) -> None:
    """After a job ran, no Ray process logged a GCS method we do not serve."""
    offending = []
    for path in cluster.ray_logs():
        for line in path.read_text(errors="replace").splitlines():
            if "Method not found" in line or "UNIMPLEMENTED" in line:
                offending.append(f"{path.name}: {line[-300:]}")
    assert not offending, "\n".join(offending[:20])
