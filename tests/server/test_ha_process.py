"""``gcs serve --ha`` as real processes on one port against a private redis-server: the
leader killed -9, the leader paused past its lease, standbys racing for one lease.

Time here is real (the processes run on their own clocks): every wait is bounded, and the
bounds that are claims (the takeover) are the configured lease plus a margin for a loaded
2-core machine, stated where they are asserted.  A KV workload records a history across
each fault; the linearizability checker must find nothing in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from gcs.proto import gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.testing.ha_group import FAST_RECONNECT, GrpcKv, HaGroup, definitely_failed
from gcs.testing.linearizability import History, Workload, check
from gcs.testing.ports import free_port
from gcs.testing.postgres import PostgresServer
from gcs.testing.redis_server import RedisServer

pytestmark = pytest.mark.slow

TTL_S = 2.0  # the default lease (ha.lease_ttl_ms)
TAKEOVER_BOUND_S = 3.0
"""Issue 21: a takeover within 3 s of the leader's death."""
LOAD_MARGIN_S = 2.0
"""A loaded 2-core machine (the suite runs beside another helper) stalls processes for
seconds at times; the bound asserted is the claim plus this."""


@pytest.fixture
def group(redis_server: RedisServer, tmp_path: pathlib.Path) -> Iterator[HaGroup]:
    group = HaGroup(redis_server.url, free_port(), tmp_path)
    yield group
    group.stop()


async def _first_answer(address: str, timeout_s: float = 30.0) -> float:
    """Monotonic time of the first answered GetClusterId at ``address``."""
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address, options=FAST_RECONNECT) as channel:
        stub = ServiceStub(channel, svc.NODE_INFO, timeout_s=1.0)
        while time.monotonic() < deadline:
            try:
                await stub.GetClusterId(G.GetClusterIdRequest())
                return time.monotonic()
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.02)
    raise TimeoutError(f"nothing answered at {address} within {timeout_s} s")


async def _register_nodes(address: str, count: int) -> list[bytes]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = ServiceStub(channel, svc.NODE_INFO, timeout_s=30)
        ids = []
        for n in range(count):
            node_id = n.to_bytes(4, "big") * 7
            await stub.RegisterNode(
                G.RegisterNodeRequest(
                    node_info=gcs_pb2.GcsNodeInfo(
                        node_id=node_id,
                        node_manager_address="127.0.0.1",
                        node_manager_port=1,  # nothing listens: health checks fail
                        resources_total={"CPU": 1},
                        state=gcs_pb2.GcsNodeInfo.ALIVE,
                    )
                )
            )
            ids.append(node_id)
        return ids


async def _alive_nodes(address: str) -> set[bytes]:
    async with grpc.aio.insecure_channel(address, options=FAST_RECONNECT) as channel:
        stub = ServiceStub(channel, svc.NODE_INFO, timeout_s=30)
        reply = await stub.GetAllNodeInfo(G.GetAllNodeInfoRequest())
        return {n.node_id for n in reply.node_info_list if n.state == gcs_pb2.GcsNodeInfo.ALIVE}


async def _status_json(address: str) -> dict[str, Any]:
    """``gcs status --format json`` of the tree under test."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gcs", "status", "--address", address, "--format", "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


class _Recorder:
    """A KV workload over gRPC at the group's address, recorded into a history."""

    def __init__(self, address: str, *, seed: int) -> None:
        self.kv = GrpcKv(address)
        self.history = History()
        self.workload = Workload(clients=4, keys=4, delete_keys=1, seed=seed)
        self._stop = False
        self.task: asyncio.Task[None] | None = None
        self.errors = 0

    async def _pause(self, err: BaseException) -> None:
        self.errors += 1
        await asyncio.sleep(0.05)  # not thousands of failed calls while nobody leads

    def start(self) -> _Recorder:
        self.task = asyncio.create_task(
            self.workload.run(
                self.kv,
                self.history,
                stop=lambda: self._stop,
                failed_if=definitely_failed,
                on_error=self._pause,
            )
        )
        return self

    async def ran(self, more: int, timeout_s: float = 60) -> None:
        """Until ``more`` further operations have been answered: a count, not a pause, so a
        loaded machine gets the same workload as an idle one (``timeout_s`` bounds a hang)."""
        await asyncio.wait_for(
            self.history.until_completed(self.history.completed + more), timeout_s
        )

    async def finish(self) -> None:
        self._stop = True
        assert self.task is not None
        await self.task
        with contextlib.suppress(Exception):
            await self.workload.read_back(self.kv, self.history, failed_if=definitely_failed)
        await self.kv.close()

    def checked(self) -> None:
        result = check(self.history.operations)
        assert result.ok, result
        assert len(self.history.operations) > 50, "the workload ran"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    yield server
    server.cleanup()


async def test_leader_kill9_the_standby_serves_at_the_same_address_within_the_bound(
    group: HaGroup,
) -> None:
    await _kill9_takeover(group)


async def test_leader_kill9_on_postgresql(postgres: PostgresServer, tmp_path: pathlib.Path) -> None:
    url = postgres.create_database(f"ha_{uuid.uuid4().hex[:8]}")
    group = HaGroup(url, free_port(), tmp_path)
    try:
        await _kill9_takeover(group)
    finally:
        group.stop()


async def _kill9_takeover(group: HaGroup) -> None:
    a = group.add("a")
    a.wait_for("ha.leader")
    nodes = await _register_nodes(group.address, 5)
    b = group.add("b")
    b.wait_for("ha.standby")
    recorder = _Recorder(group.address, seed=1).start()
    await recorder.ran(40)

    a.kill9()
    killed = time.monotonic()
    answered = await _first_answer(group.address)
    took_s = answered - killed
    await recorder.ran(40)  # the workload goes on against the new leader
    await recorder.finish()

    b.wait_for("ha.leader")  # logged once its term serves
    assert group.leaders() == [b]
    assert b.events("ha.leader")[0]["epoch"] > a.events("ha.leader")[-1]["epoch"]
    assert took_s <= TAKEOVER_BOUND_S + LOAD_MARGIN_S, f"takeover took {took_s:.2f} s"
    # raylets see one restart: the nodes are loaded alive, none marked dead for the gap
    assert set(nodes) <= await _alive_nodes(group.address)
    recorder.checked()


async def test_leader_kill9_on_the_same_host_is_replaced_well_before_the_lease_ttl(
    group: HaGroup,
) -> None:
    """A 10 s lease: the standby sees the leader's lock file released by the kernel at its
    death and takes over without waiting for the TTL (gcs.server.ha_lock)."""
    long_ttl = {"GCS_HA_LEASE_TTL_MS": "10000", "GCS_HA_RENEW_INTERVAL_MS": "500"}
    a = group.add("a", long_ttl)
    a.wait_for("ha.leader")
    b = group.add("b", long_ttl)
    b.wait_for("ha.standby")
    await _first_answer(group.address)
    b.wait_for("ha.watching_holder")  # b read the lease and holds a watch on a's lock

    a.kill9()
    killed = time.monotonic()
    answered = await _first_answer(group.address, timeout_s=30)
    took_s = answered - killed
    died = b.wait_for("ha.holder_died", timeout_s=5)
    assert died["ttl_left_ms"] > 5000, died
    b.wait_for("ha.leader")  # logged just after its term starts serving (it may answer first)
    assert group.leaders() == [b]
    # the claim: well inside the 10 s lease (bound: 3 s + the loaded-machine margin)
    assert took_s <= TAKEOVER_BOUND_S + LOAD_MARGIN_S, f"takeover took {took_s:.2f} s"


async def test_a_second_member_with_the_same_holder_name_on_one_host_is_refused(
    group: HaGroup,
) -> None:
    """Two live processes under one name would share a lock file: the second exits with one
    line on stderr (no traceback) and the first keeps leading."""
    a = group.add("a", {"GCS_HA_HOLDER": "same"})
    a.wait_for("ha.leader")
    twin = group.add("twin", {"GCS_HA_HOLDER": "same"})
    assert twin.proc is not None
    assert twin.proc.wait(60) != 0
    output = twin.log_path.read_text()
    assert "ha.holder 'same' is already in use by another process on this host" in output
    assert "Traceback" not in output
    assert group.leaders() == [a]


async def test_a_leader_paused_past_its_lease_is_ended_and_its_clients_reach_the_new_one(
    group: HaGroup,
) -> None:
    """Issue 29 item 5: the standby that takes a paused same-host leader's lease ends it
    (its lock record: pid, start time, still leading that epoch); the kernel closes its
    connections, and a channel opened before the pause is answered by the new leader (how
    soon is the partition bench's SIGSTOP row).  The call queued in the paused leader's
    socket never lands."""
    a = group.add("a")
    a.wait_for("ha.leader")
    b = group.add("b")
    b.wait_for("ha.standby")
    # a connection to the leader, open before the pause (its calls queue in a's socket)
    stale = GrpcKv(group.address, timeout_s=1.0)
    await stale.put(b"late", b"warmup", b"1", overwrite=True)
    recorder = _Recorder(group.address, seed=2).start()
    await recorder.ran(30)

    a.signal(signal.SIGSTOP)
    late_put = asyncio.create_task(stale.put(b"late", b"k", b"from-the-paused", overwrite=True))
    with pytest.raises(grpc.aio.AioRpcError):
        await late_put  # never answered by a: its deadline, or its connection reset
    # b ends the stalled ex-leader (its lock record names it); the kernel closes its sockets
    b.wait_for("ha.ended_stalled_leader", timeout_s=TTL_S + 30)
    assert a.proc is not None and a.proc.wait(10) == -signal.SIGKILL
    # the channel opened before the pause reaches b (the time it takes is the partition
    # bench's SIGSTOP row: python -m bench.ha.partitions --scenarios sigstop)
    for attempt in range(200):  # a bound on grpc's reconnect attempts, not a pace
        try:
            assert await stale.put(b"late", b"during", b"b", overwrite=True)
            break
        except grpc.aio.AioRpcError:
            assert attempt < 199, "the old channel never reached the new leader"
            await asyncio.sleep(0.05)
    assert b.count("ha.holder_died") == 0, "a paused leader keeps its lock: the TTL decided"
    await recorder.ran(30)  # against b; with the 30 before, over checked()'s 50
    await recorder.finish()
    await stale.close()

    fresh = GrpcKv(group.address)
    try:
        assert await fresh.get(b"late", b"k") is None, "the paused leader's late write landed"
        assert await fresh.get(b"late", b"during") == b"b", "b's acknowledged write was lost"
    finally:
        await fresh.close()
    b.wait_for("ha.leader")  # logged once its term serves
    assert group.leaders() == [b]
    recorder.checked()


async def test_racing_standbys_elect_exactly_one_leader(group: HaGroup) -> None:
    members = [group.add(name) for name in ("a", "b", "c")]
    for member in members:
        member.wait_for("ha.standby")
    await asyncio.sleep(TTL_S)
    leaders = group.leaders()
    assert len(leaders) == 1, [m.name for m in leaders]
    assert sum(m.count("ha.leader") for m in members) == 1
    await _first_answer(group.address)
    status = await _status_json(group.address)
    assert status["ha"]["holder"] == leaders[0].events("ha.leader")[0]["holder"]
    assert status["ha"]["epoch"] == leaders[0].events("ha.leader")[0]["epoch"]

    leaders[0].kill9()
    rest = [m for m in members if m is not leaders[0]]
    await _first_answer(group.address, timeout_s=TTL_S + 30)  # one of the rest took over
    await asyncio.sleep(TTL_S)  # a second winner would show by now
    assert len(group.leaders()) == 1
    assert sum(m.count("ha.leader") for m in rest) == 1
