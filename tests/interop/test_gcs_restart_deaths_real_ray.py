"""Deaths while our GCS is down, and a restart that forgot the cluster, under a real Ray 2.60
cluster (issue 10, item 7; the mid-job restart: ``test_gcs_restart_real_ray.py``).

Our ``gcs serve --head`` killed with SIGKILL and restarted on the same port and store (a
private ``redis-server``, a key namespace per test), unmodified ``ray start --address``
worker nodes, ``ray.init`` drivers:

* a node lost while the GCS is down is found dead by health checks after the restart, and
  its detached actor restarts on the surviving node;
* a detached actor's worker and a driver killed while the GCS is down: the raylets'
  reports reach the restarted GCS (both actors dead, names free, the job finished);
* without persistence the restarted GCS is a new cluster and the raylet exits (Ray's
  fate-sharing).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import textwrap

import pytest

from gcs.proto import common_pb2, gcs_pb2
from gcs.testing.redis_server import RedisServer
from tests.interop import venvs
from tests.interop.real_cluster import Worker, kill_group
from tests.interop.restarts import (
    DEAD,
    WORKER_HOSTS,
    actor_table,
    job_table,
    node_table,
    restartable_cluster,
)

pytestmark = [pytest.mark.interop, pytest.mark.slow]


PLACE = textwrap.dedent(
    """
    import json, os, sys, ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=sys.argv[1], namespace="ft", logging_level="ERROR")
    alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])

    @ray.remote(num_cpus=0, max_restarts=1, max_task_retries=-1)
    class Counter:
        def __init__(self):
            self.n = 0
        def incr(self):
            self.n += 1
            return self.n, ray.get_runtime_context().get_node_id(), os.getpid()

    # the mover where it lands; the stayer pinned to the other node
    mover = Counter.options(name="mover", lifetime="detached").remote()
    out = {"mover": [ray.get(mover.incr.remote(), timeout=300) for _ in range(2)]}
    other = [n for n in alive if n != out["mover"][0][1]][0]
    stayer = Counter.options(name="stayer", lifetime="detached", scheduling_strategy=(
        NodeAffinitySchedulingStrategy(other, soft=False))).remote()
    out["stayer"] = [ray.get(stayer.incr.remote(), timeout=300) for _ in range(2)]
    print(json.dumps(out))
    """
)

CALL = textwrap.dedent(
    """
    import json, sys, ray
    ray.init(address=sys.argv[1], namespace="ft", logging_level="ERROR")
    out = {name: ray.get(ray.get_actor(name).incr.remote(), timeout=300)
           for name in ("mover", "stayer")}
    print(json.dumps(out))
    """
)


def test_a_node_lost_while_the_gcs_is_down_is_found_dead_after_the_restart(
    ray_venv: venvs.Venv, redis_server: RedisServer, tmp_path: pathlib.Path
) -> None:
    """Ray's test_node_failure_detector_when_gcs_server_restart with a detached actor: a
    worker node is killed while our GCS is down; the restarted GCS's health checks find it
    dead (the other node stays alive), and the detached actor that lived there restarts on
    the surviving node, while the one on the surviving node keeps its worker and state."""
    workers = [Worker(host) for host in WORKER_HOSTS]
    with restartable_cluster(ray_venv, redis_server.url, tmp_path, workers) as c:
        placed = c.driver(PLACE)
        lost_id, kept_id = placed["mover"][0][1], placed["stayer"][0][1]
        assert [m[:2] for m in placed["mover"]] == [[1, lost_id], [2, lost_id]], placed
        assert [s[:2] for s in placed["stayer"]] == [[1, kept_id], [2, kept_id]], placed
        by_id = {n.node_id.hex(): n.node_manager_address for n in c.alive_nodes()}

        c.kill_gcs()
        c.kill_worker(WORKER_HOSTS.index(by_id[lost_id]))
        c.start_gcs()

        def lost_is_dead() -> bool:
            nodes = {n.node_id.hex(): n for n in node_table(c)}
            return nodes[lost_id].state == gcs_pb2.GcsNodeInfo.DEAD

        c.wait(lost_is_dead, 180, "the lost node marked dead")
        nodes = {n.node_id.hex(): n for n in node_table(c)}
        assert nodes[kept_id].state == gcs_pb2.GcsNodeInfo.ALIVE
        death = nodes[lost_id].death_info
        assert death.reason == common_pb2.NodeDeathInfo.UNEXPECTED_TERMINATION, death

        after = c.driver(CALL)
        assert after["mover"][:2] == [1, kept_id], after  # restarted: fresh state, other node
        assert after["stayer"] == [3, kept_id, placed["stayer"][0][2]], after
        actors = {a.name: a for a in actor_table(c)}
        assert actors["mover"].num_restarts == 1 and actors["stayer"].num_restarts == 0


def test_without_persistence_a_restart_ends_the_raylets(
    ray_venv: venvs.Venv, tmp_path: pathlib.Path
) -> None:
    """Ray's test_raylet_fate_sharing: restarted on the memory store, our GCS is a new
    cluster (new cluster id); the raylet's next call is refused as from another cluster
    (``WrongClusterID``) and the raylet exits rather than join a GCS that forgot it."""
    # the refused call is the raylet's liveness self-check: every 1 s instead of Ray's 60 s
    worker = Worker(WORKER_HOSTS[0], env={"RAY_raylet_liveness_self_check_interval_ms": "1000"})
    with restartable_cluster(ray_venv, "memory://", tmp_path, [worker]) as c:
        assert len(c.alive_nodes()) == 1
        c.kill_gcs()
        c.start_gcs()
        c.wait_exit(c.workers[0], 180, "the raylet's exit")
        assert node_table(c) == [], "nobody joined the new cluster"
        raylet = next(c.ray_logs("raylet.out")).read_text(errors="replace")
        assert "GCS returned an authentication error" in raylet, raylet[-3000:]


OWNER = textwrap.dedent(
    """
    import json, os, sys, time, ray
    ray.init(address=sys.argv[1], namespace="ft", logging_level="ERROR")

    @ray.remote(num_cpus=0)
    class Counter:
        def incr(self):
            return os.getpid()

    owned = Counter.options(name="owned").remote()  # lives as long as this driver's job
    victim = Counter.options(name="victim", lifetime="detached", max_restarts=0).remote()
    out = {"owned": ray.get(owned.incr.remote(), timeout=300),
           "victim": ray.get(victim.incr.remote(), timeout=300),
           "job_id": ray.get_runtime_context().get_job_id()}
    print(json.dumps(out), flush=True)
    time.sleep(3600)
    """
)

LOOKUP = textwrap.dedent(
    """
    import json, sys, ray
    ray.init(address=sys.argv[1], namespace="ft", logging_level="ERROR")
    out = {}
    for name in ("owned", "victim"):
        try:
            ray.get_actor(name)
            out[name] = "found"
        except ValueError:
            out[name] = "gone"
    print(json.dumps(out))
    """
)


def test_deaths_while_the_gcs_is_down_reach_it_after_the_restart(
    ray_venv: venvs.Venv, redis_server: RedisServer, tmp_path: pathlib.Path
) -> None:
    """Ray's test_actor_raylet_resubscription / ..._destroys_out_of_scope_actors: while our
    GCS is down a detached actor's worker is killed and a driver is killed (its job-scoped
    actor with it); the raylets' reports (ReportWorkerFailure, MarkJobFinished) reach the
    restarted GCS: both actors dead, names free, the driver's job finished."""
    workers = [Worker(host) for host in WORKER_HOSTS]
    with restartable_cluster(ray_venv, redis_server.url, tmp_path, workers) as c:
        owner = c.spawn([str(c.python), "-c", OWNER, c.address], name="owner")
        log = c.tmp / "owner.log"
        c.wait(lambda: log.exists() and '"job_id"' in log.read_text(), 300, "actors up")
        out = json.loads(log.read_text().strip().splitlines()[-1])

        c.kill_gcs()
        os.kill(out["victim"], signal.SIGKILL)
        kill_group(owner, grace_s=0)
        c.start_gcs()

        def both_dead() -> bool:
            actors = {a.name: a.state for a in actor_table(c)}
            return actors.get("owned") == actors.get("victim") == DEAD

        c.wait(both_dead, 180, "both actors dead")
        job_id = bytes.fromhex(out["job_id"])
        c.wait(
            lambda: any(j.job_id == job_id and j.is_dead for j in job_table(c)),
            120,
            "the killed driver's job finished",
        )
        assert c.driver(LOOKUP) == {"owned": "gone", "victim": "gone"}
