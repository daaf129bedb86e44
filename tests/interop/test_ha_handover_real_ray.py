"""A planned handover under a real Ray 2.60 cluster (issue 29): two ``gcs serve --ha --head``
members on one address and a private Redis, two ``ray start`` workers, a driver busy with
tasks, a detached and a job-scoped actor, new actors, InternalKV and the node table.  The
leadership moves A -> B (``gcs ha handover``), B -> A (again), then A is stopped with
SIGTERM (-> B): the driver sees no failed call, the actors keep their state, no node dies
or re-registers."""

from __future__ import annotations

import pathlib

import pytest

from gcs.testing.redis_server import RedisServer
from tests.interop import venvs
from tests.interop.ha_cluster import ha_ray_cluster, start_workers
from tests.interop.real_cluster import Worker
from tests.interop.restarts import WORKER_HOSTS

pytestmark = [pytest.mark.interop, pytest.mark.slow]

ROUNDS_BETWEEN = 3
"""Driver rounds (8 tasks, actor calls, KV, node table each) between two handovers."""


def test_handovers_under_a_busy_driver_fail_no_call(
    ray_venv: venvs.Venv, redis_server: RedisServer, tmp_path: pathlib.Path
) -> None:
    workers = [Worker(host) for host in WORKER_HOSTS]
    with ha_ray_cluster(ray_venv, redis_server.url, tmp_path, workers) as ha:
        a = ha.start_member("a")
        a.wait_for("ha.leader")
        b = ha.start_member("b")
        b.wait_for("ha.standby")
        start_workers(ha, workers)
        nodes = {n.node_id for n in ha.cluster.alive_nodes()}
        stop = ha.cluster.tmp / "stop"
        driver = ha.spawn_driver(stop)

        def rounds(more: int) -> None:
            want = ha.progress() + more
            ha.cluster.wait(lambda: ha.progress() >= want, 300, f"driver round {want}")

        rounds(ROUNDS_BETWEEN)
        first = ha.handover("a", to="b")
        assert first["handed_over"] and first["successor"] == "b", first
        rounds(ROUNDS_BETWEEN)
        a.wait_for("ha.standby", count=2)
        second = ha.handover("b")
        assert second["handed_over"] and second["successor"] == "a", second
        rounds(ROUNDS_BETWEEN)
        b.wait_for("ha.standby", count=2)
        assert ha.stop_member("a") == 0  # SIGTERM to the leader: a handover to b
        assert a.events("ha.handed_over")[-1]["successor"] == "b"
        rounds(ROUNDS_BETWEEN)
        result = ha.driver_result(driver, stop)
        assert result["failed"] == 0, result
        assert result["ok"] == result["rounds"] >= 4 * ROUNDS_BETWEEN
        assert result["counter"] == result["ok"] + 1  # the detached actor kept its state
        assert {n.node_id for n in ha.cluster.alive_nodes()} == nodes
