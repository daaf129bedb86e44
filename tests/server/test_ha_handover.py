"""A planned handover of a ``gcs serve --ha`` group (issue 29): ``gcs ha handover`` and
SIGTERM to the leader, real processes on one port against a private redis-server, five busy
clients of our own (no retry but gRPC's transparent one) -- not one call fails.

Before (issue 29): SIGTERM closed the leader's connections with calls in flight and new
ones refused; 720 of ~3,850 calls failed UNAVAILABLE around a 52 ms gap.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gcs.testing.ha_group import HaGroup, HaMember
from gcs.testing.ha_load import BusyClients
from gcs.testing.ports import free_port
from gcs.testing.redis_server import RedisServer

pytestmark = pytest.mark.slow

# The pause (last answer of the old leader -> first of the new; issue 29: <= 100 ms at p99)
# is a speed target: bench/ha/handover.py measures it over many handovers.  These tests show
# what must hold on any machine: no failed call, and the leadership moved by the handover.


@pytest.fixture
def group(redis_server: RedisServer, tmp_path: pathlib.Path) -> Iterator[HaGroup]:
    group = HaGroup(redis_server.url, free_port(), tmp_path)
    yield group
    group.stop()


def _member(group: HaGroup, name: str) -> tuple[HaMember, int]:
    status = free_port()
    return group.add(name, env={"GCS_HA_STATUS_PORT": str(status), "GCS_HA_HOLDER": name}), status


def _handover_cli(status_port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gcs", "ha", "handover", "--format", "json",
         "--status-address", f"127.0.0.1:{status_port}", *args],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def test_gcs_ha_handover_moves_the_leadership_with_no_failed_call(group: HaGroup) -> None:
    a, a_status = _member(group, "a")
    a.wait_for("ha.leader")
    b, _ = _member(group, "b")
    b.wait_for("ha.standby")
    clients = await BusyClients(group.address, trace=True).start()
    try:
        await clients.until_answered(300)
        asked = time.monotonic()
        done = await asyncio.to_thread(_handover_cli, a_status, "--to", "b")
        await clients.until_answered(300)  # the new leader answers them all
    finally:
        await clients.stop()
    assert done.returncode == 0, done.stderr
    # every client reconnected, each at its first attempt: a connect refused or reset (by
    # an old leader's closing listener, or a successor not yet accepting) would show as
    # TRANSIENT_FAILURE and cost gRPC's reconnect backoff (1 s, then x1.6)
    reconnected = {n for t, n, state in clients.states if t > asked and state == "READY"}
    assert reconnected == set(range(clients.clients)), clients.states
    assert clients.failed_reconnects(asked, time.monotonic()) == 0, clients.states
    result = json.loads(done.stdout)
    assert result["handed_over"] and result["successor"] == "b", result
    b.wait_for("ha.leader")  # logged once its term serves
    assert b.count("ha.leader") == 1 and group.leaders() == [b]
    assert clients.failures == [], clients.failures[:5]
    # the old leader is a standby again, and can take the leadership back the same way
    a.wait_for("ha.standby", count=2)


async def test_sigterm_to_the_leader_hands_over_with_no_failed_call(group: HaGroup) -> None:
    a, _ = _member(group, "a")
    a.wait_for("ha.leader")
    b, _ = _member(group, "b")
    b.wait_for("ha.standby")
    clients = await BusyClients(group.address).start()
    try:
        await clients.until_answered(300)
        a.stop()  # SIGTERM, waits for the exit
        await clients.until_answered(300)
    finally:
        await clients.stop()
    # before (issue 29): a few of every ~600 calls failed UNAVAILABLE around the stop
    assert clients.failures == [], (len(clients.failures), clients.calls, clients.failures[:5])
    assert a.proc is not None and a.proc.returncode == 0
    assert a.events("ha.handed_over")[0]["handed_over"] is True
    b.wait_for("ha.leader")  # logged once its term serves
    assert group.leaders() == [b]


async def test_a_standby_refuses_a_handover(group: HaGroup) -> None:
    a, _ = _member(group, "a")
    a.wait_for("ha.leader")
    b, b_status = _member(group, "b")
    b.wait_for("ha.standby")
    done = await asyncio.to_thread(_handover_cli, b_status)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "not serving as the leader" in done.stderr
    assert "Traceback" not in done.stderr


async def test_sigterm_to_a_lone_leader_stops_it(group: HaGroup) -> None:
    a, _ = _member(group, "a")
    a.wait_for("ha.leader")
    a.stop()  # nobody takes the released lease: a plain stop after two renewal intervals
    assert a.proc is not None and a.proc.returncode == 0
    assert a.events("ha.handed_over")[0]["handed_over"] is False
