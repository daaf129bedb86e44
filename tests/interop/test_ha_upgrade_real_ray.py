"""A rolling upgrade of a ``gcs serve --ha`` group under a real Ray 2.60 cluster (issue 29).

The previous version of this repository (``tests.interop.previous_version``: a commit from
history, exported and run with this virtualenv) leads; a member of this version follows as
a standby.  Two ``ray start`` workers and a busy driver (tasks, actors, new actors, KV, the
node table).  The old leader is stopped (SIGTERM: the old version releases its lease) and
the new member takes over and expands the store's format; a second new member joins,
``gcs ha finish-upgrade`` contracts the format, and a planned handover moves the leadership
between the two new members.  The driver sees no failed call; the actors keep their state;
no node dies or re-registers."""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gcs.store.factory import open_store
from gcs.store.format import FORMAT_VERSION, StoreFormat, read_format
from gcs.testing.previous_version import export_previous, missing_reason
from gcs.testing.redis_server import RedisServer
from tests.interop import venvs
from tests.interop.ha_cluster import HaRayCluster, ha_ray_cluster, start_workers
from tests.interop.real_cluster import Worker
from tests.interop.restarts import WORKER_HOSTS

pytestmark = [pytest.mark.interop, pytest.mark.slow]

ROUNDS_BETWEEN = 3


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    yield export_previous(tmp_path_factory.mktemp("previous"))


def _format(ha: HaRayCluster) -> StoreFormat:
    async def read() -> StoreFormat:
        store = await open_store(ha.cluster.storage, namespace=ha.namespace, ha=True)
        try:
            return (await read_format(store))[0]
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_rolling_upgrade_under_a_busy_driver_fails_no_call(
    ray_venv: venvs.Venv,
    redis_server: RedisServer,
    previous_tree: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    workers = [Worker(host) for host in WORKER_HOSTS]
    with ha_ray_cluster(ray_venv, redis_server.url, tmp_path, workers) as ha:
        old = ha.start_member("old", source=previous_tree)
        old.wait_for("ha.leader")
        new1 = ha.start_member("new1")
        new1.wait_for("ha.standby")
        start_workers(ha, workers)
        nodes = {n.node_id for n in ha.cluster.alive_nodes()}
        assert _format(ha) == StoreFormat(1, 1)  # the old version writes no format record
        stop = ha.cluster.tmp / "stop"
        driver = ha.spawn_driver(stop)

        def rounds(more: int) -> None:
            want = ha.progress() + more
            ha.cluster.wait(lambda: ha.progress() >= want, 300, f"driver round {want}")

        rounds(ROUNDS_BETWEEN)
        # step 1: the last old member goes; the new standby takes over (expand)
        assert ha.stop_member("old") == 0
        new1.wait_for("ha.leader")
        assert _format(ha) == StoreFormat(FORMAT_VERSION, 1)
        rounds(ROUNDS_BETWEEN)
        # step 2: a second new member; no old one left: contract
        new2 = ha.start_member("new2")
        new2.wait_for("ha.standby")
        done = subprocess.run(
            [sys.executable, "-m", "gcs", "ha", "finish-upgrade", "--format", "json",
             "--storage", ha.cluster.storage, "--namespace", ha.namespace],
            check=False, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["min_reader"] == FORMAT_VERSION
        # step 3: from now on, planned handovers between new members
        moved = ha.handover("new1", to="new2")
        assert moved["handed_over"] and moved["successor"] == "new2", moved
        rounds(ROUNDS_BETWEEN)
        result = ha.driver_result(driver, stop)
        assert result["failed"] == 0, result
        assert result["ok"] == result["rounds"] >= 3 * ROUNDS_BETWEEN
        assert result["counter"] == result["ok"] + 1
        assert {n.node_id for n in ha.cluster.alive_nodes()} == nodes
        assert _format(ha) == StoreFormat(FORMAT_VERSION, FORMAT_VERSION)
