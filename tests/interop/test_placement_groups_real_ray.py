"""Placement groups and virtual clusters of an unmodified Ray 2.60 cluster on our GCS
(issue 10 items 5 and 6).

One cluster for the module: ``gcs serve --head`` on 127.0.0.2, two real ``ray start`` workers
of different node types (``RAY_NODE_TYPE_NAME``: 127.0.0.2 is ``alpha`` and has one custom
``slot``, 127.0.0.3 is ``beta``); two tests add a third ``beta`` worker on 127.0.0.4 (one
kills it again).  The
tests do not depend on their order (randomised runs): each uses its own resources or names.

* a STRICT_SPREAD group of 2 becomes ready, a task in each bundle runs on a distinct node,
  the raylets expose Ray's bundle resources, the group is found by name;
* a STRICT_SPREAD group of 3 waits for a node (gang demand in GetClusterResourceState, a
  pending placement group in ``ray status``) and becomes ready once a third worker joins;
* a bundle on a worker that is killed is placed again on a live node;
* removing a group gives its resources back (a task needing them then runs), and so does
  the end of the job that created it;
* a group placed before a kill -9 and restart of our GCS (the module's cluster is on SQLite
  for it) is still CREATED after it, its bundles still held by the raylets;
* a job in a virtual cluster (``JobConfig(metadata={"virtual_cluster_id": ...})``) places its
  actors and groups only on the cluster's node; a job without one uses both.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from gcs.proto import autoscaler_pb2
from tests.interop import venvs
from tests.interop.real_cluster import RealCluster, Worker, real_cluster

pytestmark = [pytest.mark.interop, pytest.mark.slow]

ALPHA = Worker("127.0.0.2", resources={"slot": 1}, env={"RAY_NODE_TYPE_NAME": "alpha"})
BETA = Worker("127.0.0.3", env={"RAY_NODE_TYPE_NAME": "beta"})
THIRD = Worker("127.0.0.4", env={"RAY_NODE_TYPE_NAME": "beta"})

PRELUDE = """
import json, sys, time, ray
from ray.util.placement_group import (
    placement_group, placement_group_table, get_placement_group, remove_placement_group)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

def in_bundle(pg, index=-1):
    return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)

@ray.remote(num_cpus=1)
def where():
    return ray.get_runtime_context().get_node_id()
"""

STRICT_SPREAD_2 = """
ray.init(address=sys.argv[1], namespace="pgs", logging_level="ERROR")
pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD", name="two")
ray.get(pg.ready(), timeout=300)
nodes = [ray.get(where.options(scheduling_strategy=in_bundle(pg, i)).remote(), timeout=300)
         for i in range(2)]
any_bundle = ray.get(where.options(scheduling_strategy=in_bundle(pg)).remote(), timeout=300)
table = placement_group_table(pg)
deadline = time.time() + 60  # the raylets report their new resources through the syncer
while True:
    group = {k: v for k, v in ray.cluster_resources().items() if pg.id.hex() in k}
    if group or time.time() > deadline:
        break
    time.sleep(0.5)
out = {"nodes": nodes, "any": any_bundle, "state": table["state"],
       "bundles_to_node": table["bundles_to_node_id"], "group_resources": group,
       "by_name": get_placement_group("two").id.hex() == pg.id.hex()}
remove_placement_group(pg)
print(json.dumps(out))
"""

THREE_PENDING = """
ray.init(address=sys.argv[1], namespace="pgs", logging_level="ERROR")
pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD", name="three",
                     lifetime="detached")
ready = pg.wait(timeout_seconds=1)  # 3 distinct nodes of 2: it cannot be ready, however long
print(json.dumps({"ready": ready, "id": pg.id.hex(),
                  "state": placement_group_table(pg)["state"]}))
"""

THREE_READY = """
ray.init(address=sys.argv[1], namespace="pgs", logging_level="ERROR")
pg = get_placement_group("three")
ray.get(pg.ready(), timeout=300)
nodes = [ray.get(where.options(scheduling_strategy=in_bundle(pg, i)).remote(), timeout=300)
         for i in range(3)]
remove_placement_group(pg)
print(json.dumps({"nodes": nodes}))
"""

REMOVAL = """
ray.init(address=sys.argv[1], namespace="pgs", logging_level="ERROR")

@ray.remote(num_cpus=0, resources={"slot": 1})
def slotted():
    return ray.get_runtime_context().get_node_id()

pg = placement_group([{"slot": 1}], strategy="PACK")
ray.get(pg.ready(), timeout=300)
inside = ray.get(slotted.options(scheduling_strategy=in_bundle(pg, 0)).remote(), timeout=300)
outside = slotted.remote()  # needs the slot the group holds
ready, _ = ray.wait([outside], timeout=5)
blocked = not ready
remove_placement_group(pg)
after = ray.get(outside, timeout=300)
left = placement_group([{"slot": 1}], strategy="PACK")  # never removed: the job's end does
ray.get(left.ready(), timeout=300)
print(json.dumps({"inside": inside, "blocked": blocked, "after": after}))
"""

SLOT_AGAIN = """
ray.init(address=sys.argv[1], namespace="pgs", logging_level="ERROR")

@ray.remote(num_cpus=0, resources={"slot": 1})
def slotted():
    return ray.get_runtime_context().get_node_id()

print(json.dumps({"node": ray.get(slotted.remote(), timeout=300)}))
"""

VC_JOB = """
from ray.job_config import JobConfig
cluster = sys.argv[2]
config = JobConfig(metadata={"virtual_cluster_id": cluster}) if cluster else None
ray.init(address=sys.argv[1], namespace="vc", logging_level="ERROR", job_config=config)

@ray.remote(num_cpus=0.1)
class Where:
    def node(self):
        return ray.get_runtime_context().get_node_id()

actors = [Where.options(scheduling_strategy="SPREAD").remote() for _ in range(4)]
actor_nodes = ray.get([a.node.remote() for a in actors], timeout=300)
pg = placement_group([{"CPU": 0.1}, {"CPU": 0.1}], strategy="SPREAD")
ray.get(pg.ready(), timeout=300)
pg_nodes = sorted(set(placement_group_table(pg)["bundles_to_node_id"].values()))
in_pg = Where.options(num_cpus=0.1, scheduling_strategy=in_bundle(pg, 0)).remote()
pg_actor_node = ray.get(in_pg.node.remote(), timeout=300)
remove_placement_group(pg)
print(json.dumps({"actor_nodes": sorted(set(actor_nodes)), "pg_nodes": pg_nodes,
                  "pg_actor_node": pg_actor_node}))
"""

KEPT_CREATE = """
ray.init(address=sys.argv[1], namespace="pgs", logging_level="ERROR")
pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD", name="kept",
                     lifetime="detached")
ray.get(pg.ready(), timeout=300)
nodes = [ray.get(where.options(scheduling_strategy=in_bundle(pg, i)).remote(), timeout=300)
         for i in range(2)]
print(json.dumps({"id": pg.id.hex(), "nodes": nodes}))
"""

KEPT_AFTER_RESTART = """
ray.init(address=sys.argv[1], namespace="pgs", logging_level="ERROR")
pg = get_placement_group("kept")
ray.get(pg.ready(), timeout=300)
state = placement_group_table(pg)["state"]
nodes = [ray.get(where.options(scheduling_strategy=in_bundle(pg, i)).remote(), timeout=300)
         for i in range(2)]
def group_resources():
    return sorted(k for k in ray.cluster_resources() if pg.id.hex() in k)
held = group_resources()
remove_placement_group(pg)
deadline = time.time() + 120
while group_resources() and time.time() < deadline:
    time.sleep(0.5)
print(json.dumps({"state": state, "nodes": nodes, "held": held, "after": group_resources()}))
"""

MOVED_CREATE = """
ray.init(address=sys.argv[1], namespace="pgs", logging_level="ERROR")
pg = placement_group([{"CPU": 1}], strategy="STRICT_PACK", name="moved", lifetime="detached",
                     _soft_target_node_id=sys.argv[2])
ray.get(pg.ready(), timeout=300)
node = ray.get(where.options(scheduling_strategy=in_bundle(pg, 0)).remote(), timeout=300)
print(json.dumps({"node": node, "placed": placement_group_table(pg)["bundles_to_node_id"][0]}))
"""

MOVED_AFTER = """
ray.init(address=sys.argv[1], namespace="pgs", logging_level="ERROR")
dead = sys.argv[2]
pg = get_placement_group("moved")
states = []
deadline = time.time() + 300
while time.time() < deadline:
    table = placement_group_table(pg)
    if not states or states[-1] != table["state"]:
        states.append(table["state"])
    placed = table["bundles_to_node_id"].get(0)
    if table["state"] == "CREATED" and placed not in (None, dead):
        break
    time.sleep(0.2)
node = ray.get(where.options(scheduling_strategy=in_bundle(pg, 0)).remote(), timeout=300)
remove_placement_group(pg)
print(json.dumps({"states": states, "placed": placed, "node": node}))
"""


@pytest.fixture(scope="module")
def cluster(ray_venv: venvs.Venv) -> Iterator[RealCluster]:
    """On SQLite: the GCS restart test kills and restarts this cluster's GCS (a cluster of
    its own cost ~20 CPU s more: two more nodes, their drivers' workers)."""
    with real_cluster(ray_venv, workers=[ALPHA, BETA], storage="sqlite:///{tmp}/gcs.db") as c:
        yield c


def driver(
    cluster: RealCluster, script: str, *args: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    return cluster.driver(PRELUDE + script, *args, env=env)


def node_ids_by_host(cluster: RealCluster) -> dict[str, str]:
    return {n.node_manager_address: n.node_id.hex() for n in cluster.alive_nodes()}


def cluster_resource_state(cluster: RealCluster) -> autoscaler_pb2.GetClusterResourceStateReply:
    with grpc.insecure_channel(cluster.address) as channel:
        call = channel.unary_unary(
            "/ray.rpc.autoscaler.AutoscalerStateService/GetClusterResourceState",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=autoscaler_pb2.GetClusterResourceStateReply.FromString,
        )
        reply: autoscaler_pb2.GetClusterResourceStateReply = call(
            autoscaler_pb2.GetClusterResourceStateRequest(), timeout=10
        )
    return reply


def test_strict_spread_group_runs_a_task_in_each_bundle_on_distinct_nodes(
    cluster: RealCluster,
) -> None:
    out = driver(cluster, STRICT_SPREAD_2)
    assert out["state"] == "CREATED", out
    assert out["by_name"], out
    assert len(set(out["nodes"])) == 2, out
    assert out["nodes"] == [out["bundles_to_node"][str(i)] for i in range(2)], out
    assert out["any"] in out["nodes"], out
    # The raylets' own bundle resources, as Ray 2.60 names them.
    names = set(out["group_resources"])
    assert any(n.startswith("CPU_group_0_") for n in names), names
    assert any(n.startswith("CPU_group_1_") for n in names), names
    assert any(n.startswith("bundle_group_") for n in names), names


def test_removed_group_gives_its_resources_back(cluster: RealCluster) -> None:
    out = driver(cluster, REMOVAL)
    alpha = node_ids_by_host(cluster)[ALPHA.host]
    assert out == {"inside": alpha, "blocked": True, "after": alpha}
    # The driver left a group holding the slot; its job ended, so the group is removed.
    assert driver(cluster, SLOT_AGAIN) == {"node": alpha}


def test_strict_spread_of_three_waits_for_a_third_node(cluster: RealCluster) -> None:
    assert len(cluster.alive_nodes()) == 2
    pending = driver(cluster, THREE_PENDING)
    assert pending["ready"] is False and pending["state"] == "PENDING", pending
    state = cluster_resource_state(cluster).cluster_resource_state
    gangs = [g for g in state.pending_gang_resource_requests if pending["id"] in g.details]
    assert len(gangs) == 1, state
    assert len(gangs[0].requests) == 3
    assert all(dict(r.resources_bundle) == {"CPU": 1.0} for r in gangs[0].requests)
    status = cluster.run(
        [str(cluster.ray_bin), "status", "--address", cluster.address], timeout=300
    )
    assert status.returncode == 0, status.stderr[-3000:]
    assert "(STRICT_SPREAD): 1+ pending placement groups" in status.stdout, status.stdout

    cluster.add_worker(THIRD)
    cluster.wait_workers()
    out = driver(cluster, THREE_READY)
    assert len(set(out["nodes"])) == 3, out
    state = cluster_resource_state(cluster).cluster_resource_state
    assert not [g for g in state.pending_gang_resource_requests if pending["id"] in g.details]


def test_a_dead_nodes_bundle_is_placed_again_on_another_node(cluster: RealCluster) -> None:
    """A group placed on the third worker (its soft target); the worker is killed: our GCS
    marks the bundle lost (RESCHEDULING) and places it on a live node, where a task in it
    then runs."""
    if len(cluster.alive_nodes()) < 3:
        cluster.add_worker(THIRD)
        cluster.wait_workers()
    third = node_ids_by_host(cluster)[THIRD.host]
    index = max(i for i in range(len(cluster.workers)) if i not in cluster.killed)
    before = driver(cluster, MOVED_CREATE, third)
    assert before == {"node": third, "placed": third}, before
    cluster.kill_worker(index)
    after = driver(cluster, MOVED_AFTER, third)
    survivors = set(node_ids_by_host(cluster).values())
    assert third not in survivors
    assert after["placed"] in survivors and after["node"] == after["placed"], after
    assert after["states"][-1] == "CREATED", after


def test_virtual_cluster_job_places_actors_and_groups_on_its_nodes_only(
    cluster: RealCluster,
) -> None:
    by_host = node_ids_by_host(cluster)
    alpha, beta = by_host[ALPHA.host], by_host[BETA.host]
    nodes = {n.node_id.hex(): n.node_type_name for n in cluster.alive_nodes()}
    assert nodes[alpha] == "alpha" and nodes[beta] == "beta", nodes
    created = cluster.run(
        [
            sys.executable, "-m", "gcs", "vcluster", "create", "--id", "vc_alpha",
            "--replica-sets", json.dumps({"alpha": 1}), "--gcs-address", cluster.address,
        ],
        timeout=60,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    try:
        inside = driver(cluster, VC_JOB, "vc_alpha")
        want = {"actor_nodes": [alpha], "pg_nodes": [alpha], "pg_actor_node": alpha}
        assert inside == want, inside
        # The same for an unchanged script, through the job config Ray reads from the
        # environment (what `ray job submit --metadata-json` sets for its driver).
        injected = {"metadata": {"virtual_cluster_id": "vc_alpha"}}
        env = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(injected)}
        assert driver(cluster, VC_JOB, "", env=env) == want
        # An unknown cluster: AddJob refuses the job; Ray 2.60's driver aborts in ray.init
        # with our message (its core worker checks the status).
        refused = cluster.run(
            [str(cluster.python), "-c", PRELUDE + VC_JOB, cluster.address, "nope"], timeout=300
        )
        assert refused.returncode != 0
        assert "Invalid virtual cluster, virtual cluster id: nope" in refused.stderr
        outside = driver(cluster, VC_JOB, "")
        assert alpha in outside["actor_nodes"] and len(outside["actor_nodes"]) >= 2, outside
        assert len(outside["pg_nodes"]) == 2, outside
    finally:
        cluster.run(
            [sys.executable, "-m", "gcs", "vcluster", "remove", "vc_alpha",
             "--gcs-address", cluster.address],
            timeout=60,
        )  # fmt: skip


def test_a_placed_group_survives_a_gcs_restart_and_keeps_its_bundles(
    cluster: RealCluster,
) -> None:
    """kill -9 of our GCS (SQLite store) and a restart: the raylets keep the committed
    bundles (``ReleaseUnusedBundles`` names them in use), the group is still CREATED and
    its bundles run tasks on the same nodes; removing it then returns the resources.  (The
    other tests pass whether they run before or after it: a restart is invisible to them.)"""
    before = driver(cluster, KEPT_CREATE)
    assert len(set(before["nodes"])) == 2, before
    cluster.kill_gcs()
    cluster.start_gcs()
    cluster.wait_workers()
    after = driver(cluster, KEPT_AFTER_RESTART)
    assert after["state"] == "CREATED" and after["nodes"] == before["nodes"], after
    assert any(n.startswith("CPU_group_0_") for n in after["held"]), after
    assert after["after"] == [], after
