"""kill -9 our GCS under a real Ray 2.60 cluster mid-job and restart it (issue 10, item 7).

Our ``gcs serve --head`` on SQLite (the same restart on Redis is the deaths module's),
unmodified ``ray start --address`` worker nodes, ``ray.init`` drivers:
a driver runs 64 tasks of ~0.5 s over two nodes while it keeps calling a detached named
actor and a job-scoped actor, holding a placement group; our GCS is killed with SIGKILL,
tasks and actor calls go on while it is down, new work that needs it (an actor, a function
export, bundle tasks) waits, and it is restarted on the same port and store (the job's last
tasks wait for that, so the job straddles the restart).  Every result is right, the actors
kept their workers and state, no node was marked dead or re-registered, both raylets were
told (NotifyGCSRestart), resubscribed (new publisher id, jobs and nodes refetched) and
reopened their syncer streams, a second placement group fits beside the first, the job is
marked finished when the driver leaves and a new driver works.

Deaths while the GCS is down, and a restart without persistence:
``test_gcs_restart_deaths_real_ray.py`` (another module: xdist runs the two side by side).
"""

from __future__ import annotations

import json
import pathlib
import re
import textwrap

import pytest

from gcs.proto import gcs_pb2
from tests.interop import venvs
from tests.interop.real_cluster import RealCluster, Worker
from tests.interop.restarts import (
    ALIVE,
    DEAD,
    WORKER_HOSTS,
    actor_table,
    job_table,
    node_table,
    restartable_cluster,
)

pytestmark = [pytest.mark.interop, pytest.mark.slow]

TASKS = 64
HELD = 16
"""The last tasks of the job wait for the restarted GCS (a file the test writes once it
serves): the job straddles the restart whatever the machine's speed."""

DRIVER = textwrap.dedent(
    """
    import collections, json, os, sys, time, ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address=sys.argv[1], namespace="ft", logging_level="ERROR")
    tasks, held, gcs_down, gcs_back = int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6]

    @ray.remote(num_cpus=0)
    class Counter:
        def __init__(self):
            self.n = 0
        def incr(self):
            self.n += 1
            return self.n

    @ray.remote(num_cpus=1)
    def square(i):
        time.sleep(0.5)
        while i >= tasks - held and not os.path.exists(gcs_back):
            time.sleep(0.1)
        return i * i, ray.get_runtime_context().get_node_id()

    @ray.remote(num_cpus=0, resources={"slot": 1})
    def where():
        return ray.get_runtime_context().get_node_id()

    def in_bundle(pg, i):
        return where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i)).remote()

    detached = Counter.options(name="ft_counter", lifetime="detached").remote()
    scoped = Counter.remote()
    calls = 0
    assert ray.get([detached.incr.remote(), scoped.incr.remote()], timeout=300) == [1, 1]
    calls += 1
    pg = placement_group([{"slot": 1}] * 2, strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=300)
    pending = [square.remote(i) for i in range(tasks)]
    results, done, late = {}, 0, None
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=600)
        for ref in ready:
            value, node = ray.get(ref)
            results[value] = node
            done += 1
        # the actors are called throughout, the GCS down or not
        got = ray.get([detached.incr.remote(), scoped.incr.remote()], timeout=600)
        calls += 1
        assert got == [calls, calls], (got, calls)
        if late is None and os.path.exists(gcs_down):
            # asked for while the GCS is down (what needs it waits until it is back)
            print("asking late", flush=True)
            late = Counter.remote()
            late_first = late.incr.remote()
            bundles = [in_bundle(pg, i) for i in range(2)]
        print(f"progress {done}", flush=True)
    # a second group beside the first: the restarted GCS knows what the first one holds
    pg2 = placement_group([{"slot": 1}] * 2, strategy="STRICT_SPREAD")
    ray.get(pg2.ready(), timeout=300)
    out = {
        "correct": sorted(results) == [i * i for i in range(tasks)],
        "nodes": collections.Counter(results.values()),
        "calls": calls,
        "detached": ray.get(detached.incr.remote(), timeout=300),
        "scoped": ray.get(scoped.incr.remote(), timeout=300),
        "late": [ray.get(late_first, timeout=300), ray.get(late.incr.remote(), timeout=300)],
        "bundle_nodes": ray.get(bundles, timeout=300),
        "pg2_nodes": ray.get([in_bundle(pg2, i) for i in range(2)], timeout=300),
        "job_id": ray.get_runtime_context().get_job_id(),
    }
    remove_placement_group(pg)
    remove_placement_group(pg2)
    print(json.dumps(out), flush=True)
    """
)

AFTER = textwrap.dedent(
    """
    import json, sys, ray
    from ray.util.placement_group import placement_group
    ray.init(address=sys.argv[1], namespace="ft", logging_level="ERROR")

    @ray.remote(num_cpus=1)
    def one():
        return 1

    counter = ray.get_actor("ft_counter")
    # both earlier groups were removed: their slots are free again
    pg = placement_group([{"slot": 2}] * 2, strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=300)
    out = {"tasks": sum(ray.get([one.remote() for _ in range(8)], timeout=300)),
           "detached": ray.get(counter.incr.remote(), timeout=300),
           "alive": sum(1 for n in ray.nodes() if n["Alive"]),
           "job_id": ray.get_runtime_context().get_job_id()}
    ray.kill(counter)
    print(json.dumps(out))
    """
)


RESUBSCRIBED = (
    "The GCS has restarted. Resubscribing to pubsub",
    "is different from last seen publisher_id",
    "Finished fetching all job information from gcs server after gcs server",
    "Finished fetching all node address and liveness information for resubscription",
)
"""What a Ray 2.60 raylet logs when it learns of a GCS restart and resubscribes."""


def _progress(cluster: RealCluster) -> int:
    path = cluster.tmp / "driver.log"
    found = re.findall(r"^progress (\d+)$", path.read_text(errors="replace"), re.MULTILINE)
    return int(found[-1]) if found else 0


def _gcs_events(cluster: RealCluster, start: int) -> list[dict[str, object]]:
    """The JSON log records of our GCS's ``start``-th run."""
    out = []
    for line in (cluster.tmp / f"gcs{start}.log").read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_gcs_killed_mid_job_and_restarted_the_job_finishes(
    tmp_path: pathlib.Path, ray_venv: venvs.Venv
) -> None:
    """On the embedded store (the default): the same restart on Redis is the deaths module's
    (``test_gcs_restart_deaths_real_ray.py``), and each store's durability is the contract
    suite's, so the job's restart runs once."""
    storage = "sqlite:///{tmp}/gcs.db"
    workers = [Worker(host, resources={"slot": 2}) for host in WORKER_HOSTS]
    with restartable_cluster(ray_venv, storage, tmp_path, workers) as c:
        _run(c)


def _run(c: RealCluster) -> None:
    before = {n.node_id for n in c.alive_nodes()}
    assert len(before) == 2
    flag, back = c.tmp / "gcs_down", c.tmp / "gcs_back"
    args = [str(c.python), "-c", DRIVER, c.address, str(TASKS), str(HELD), str(flag), str(back)]
    driver = c.spawn(args, name="driver")
    c.wait(lambda: _progress(c) >= 4, 600, "the job under way")

    c.kill_gcs()
    down_at = _progress(c)
    # work goes on while the GCS is down: leased workers, actor calls, object transfers
    c.wait(lambda: _progress(c) >= down_at + 4, 50, "progress with the GCS down")
    # then new work that needs the GCS (an actor, a function's export, bundle tasks)
    flag.touch()
    asked = lambda: "asking late" in (c.tmp / "driver.log").read_text()  # noqa: E731
    c.wait(asked, 30, "the driver asking for new work with the GCS down")
    assert driver.poll() is None, c.logs()
    c.start_gcs()
    assert _progress(c) <= TASKS - HELD, "the job straddles the restart"
    back.touch()
    # reloaded, ALIVE on the same workers (a third is asked for while the GCS was down)
    actors = {a.actor_id: a for a in actor_table(c)}
    assert len(actors) >= 2 and {"ft_counter", ""} <= {a.name for a in actors.values()}
    alive = {a.actor_id: a.pid for a in actors.values() if a.state == ALIVE}
    assert len(alive) >= 2, actors

    # both raylets reopen their syncer streams: fresh views in the new GCS's node table
    c.wait(lambda: c.synced_raylets() == 2, 120, "both raylets synced after the restart")
    c.wait_exit(driver, 900, "the job finished")
    assert driver.returncode == 0, c.logs()
    out = json.loads((c.tmp / "driver.log").read_text().strip().splitlines()[-1])
    assert out["correct"], out
    assert out["calls"] == TASKS + 1
    assert out["detached"] == out["scoped"] == TASKS + 2, out
    assert out["late"] == [1, 2], out
    alive_hex = {n.hex() for n in before}
    assert set(out["bundle_nodes"]) == set(out["pg2_nodes"]) == alive_hex, out
    assert _progress(c) == TASKS
    actors = {a.actor_id: a for a in actor_table(c)}
    assert len(actors) == 3, actors
    for actor_id, pid in alive.items():  # never restarted
        assert actors[actor_id].pid == pid and actors[actor_id].num_restarts == 0

    nodes = node_table(c)
    assert {n.node_id for n in nodes} == before, "no node re-registered"
    assert all(n.state == gcs_pb2.GcsNodeInfo.ALIVE for n in nodes), nodes

    # the job the driver ran is marked finished once the driver left
    job_id = bytes.fromhex(out["job_id"])

    def finished() -> bool:
        jobs = {j.job_id: j for j in job_table(c)}
        return job_id in jobs and jobs[job_id].is_dead

    c.wait(finished, 120, f"job {out['job_id']} marked finished")

    # the job-scoped actors went with their job, the detached one lives on
    def scoped_dead() -> bool:
        states = {a.name or a.actor_id.hex(): a.state for a in actor_table(c)}
        return states.pop("ft_counter") == ALIVE and set(states.values()) == {DEAD}

    c.wait(scoped_dead, 120, "the job's actors dead, the detached one alive")

    after = c.driver(AFTER)
    new_job = after.pop("job_id")
    assert after == {"tasks": 8, "detached": TASKS + 3, "alive": 2}, after
    assert int.from_bytes(bytes.fromhex(new_job), "little") > int.from_bytes(job_id, "little"), (
        "job ids never go back across restarts"
    )

    # the new GCS told both raylets it restarted (NotifyGCSRestart) ...
    events = _gcs_events(c, 2)
    (notices,) = [e for e in events if e.get("event") == "raylet.restart_notices"]
    assert notices["notified"] >= len(before) and notices["failed"] == 0, notices
    assert not [e for e in events if e.get("event") == "node.dead"], events
    # ... and both resubscribed: saw the new publisher id and refetched jobs and nodes
    for temp_dir in c.temp_dirs:
        raylet = (temp_dir / "session_latest" / "logs" / "raylet.out").read_text(errors="replace")
        for line in RESUBSCRIBED:
            assert line in raylet, f"{line!r} not in {temp_dir}'s raylet.out"
