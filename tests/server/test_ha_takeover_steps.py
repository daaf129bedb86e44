"""A successor's part of a takeover made short (issue 29, the planned handover's pause): what
does not depend on the lease is built by the standby while it waits, and every step from the
lease to serving is logged with its monotonic time (``gcs.server.ha_steps``), on both sides
of a planned handover.  In-process ``GcsServer``s on one MemoryStore, the fake clock."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from structlog.testing import capture_logs

from gcs.base.clock import FakeClock
from gcs.config import GcsConfig, HaConfig
from gcs.managers.kv import encode_key
from gcs.sdk import HA_LEADER_KEY, HA_NAMESPACE
from gcs.server import GcsServer, rpc_server
from gcs.server.ha_handover import lead_handover
from gcs.store.base import TABLE_KV, WriteBatch
from gcs.store.ha import Change
from gcs.store.memory import MemoryStore
from gcs.testing.ports import free_port

TAKEOVER_STEPS = ("acquired", "drained", "built", "loaded", "registered", "bound", "recorded")
RECORD_KEY = encode_key(HA_NAMESPACE, HA_LEADER_KEY)
HANDOVER_STEPS = ("held", "quiesced", "notice_written", "released", "successor_seen", "handed_off")


def _config(port: int, holder: str) -> GcsConfig:
    return GcsConfig(
        port=port,
        metrics_port=-1,
        storage="memory://",
        ha=HaConfig(enabled=True, holder=holder, status_port=-1),
    )


async def _services(address: str) -> set[str]:
    """The service names the port's reflection lists."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for reply in stub.ServerReflectionInfo(iter([request]), timeout=10):
            return {s.name for s in reply.list_services_response.service}
    return set()


async def test_the_standby_builds_the_reflection_pool_ahead_and_its_terms_reuse_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[object] = []
    real = rpc_server.wire_pool

    def counted(services: object) -> object:
        pool = real(services)  # type: ignore[arg-type]
        built.append(pool)
        return pool

    monkeypatch.setattr(rpc_server, "wire_pool", counted)
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    port = free_port()
    a_store, b_store = shared.handle(), shared.handle()
    a = GcsServer(_config(port, "a"), store=a_store, clock=clock)
    b = GcsServer(_config(port, "b"), store=b_store, clock=clock)
    try:
        await a.start()
        await clock.advance_until(lambda: a.ha is not None and a.ha.serving, 0.05)
        await b.start()  # warm: it built its parts while standing by
        assert b.wiring is None
        ahead = len(built)
        a_store.fail_writes = True  # a loses the store: b takes over
        await clock.advance_until(lambda: b.ha is not None and b.ha.serving, 0.05)
        # the term built no pool: it reused the one the standby built (off the takeover)
        assert len(built) == ahead
        assert b.prepared.parts is not None and b.wiring is not None
        assert b.wiring.rpc.prepared is b.prepared.parts
        assert "ray.rpc.NodeInfoGcsService" in await _services(f"127.0.0.1:{port}")
        # and back: a's second term reuses its parts too, and reflection still answers
        a_store.fail_writes = False
        b_store.fail_writes = True
        await clock.advance_until(
            lambda: a.ha is not None and a.ha.serving and b.wiring is None, 0.05
        )
        assert len(built) == ahead and a.wiring is not None
        assert a.wiring.rpc.prepared is a.prepared.parts
        assert "ray.rpc.InternalKVGcsService" in await _services(f"127.0.0.1:{port}")
    finally:
        await b.stop()
        await a.stop()


async def test_both_sides_of_a_planned_handover_log_their_steps_in_order() -> None:
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    port = free_port()
    a = GcsServer(_config(port, "a"), store=shared.handle(), clock=clock)
    b = GcsServer(_config(port, "b"), store=shared.handle(), clock=clock)
    try:
        await a.start()
        await clock.advance_until(lambda: a.ha is not None and a.ha.serving, 0.05)
        await b.start()
        assert a.ha is not None and b.ha is not None
        with capture_logs() as logs:
            handing = asyncio.create_task(a.ha.hand_over("b"))
            await clock.advance_until(handing.done, 0.001)
            assert (await handing).successor == "b"
        handed = next(e for e in logs if e["event"] == "ha.handed_over")
        leader = next(e for e in logs if e["event"] == "ha.leader")
        assert list(handed["steps"]) == list(HANDOVER_STEPS)
        took = leader["steps"]
        # the successor saw the notice, then followed its part in this order
        assert "noticed" in took and set(TAKEOVER_STEPS) <= set(took)
        times = [took["noticed"], *(took[step] for step in TAKEOVER_STEPS)]
        assert times == sorted(times)
        assert handed["steps"]["notice_written"] <= took["noticed"]
        assert took["recorded"] <= handed["steps"]["successor_seen"]
    finally:
        await b.stop()
        await a.stop()


class _Term:
    """A leader's term as a handover sees it; its leader record read from the store."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.looks = 0
        """How often the leader record was read from the store."""

    def hold(self) -> None:
        return None

    async def quiesce(self, bound_s: float) -> int:
        return 0

    def hand_off(self) -> int:
        return 0

    async def leader_record(self) -> bytes | None:
        self.looks += 1
        return await self._store.get(TABLE_KV, RECORD_KEY)

    def recorded_in(self, change: Change) -> bytes | None:
        return change.value if (change.table, change.key) == (TABLE_KV, RECORD_KEY) else None


async def test_a_leader_handing_over_sees_its_successor_in_the_change_stream_not_by_polling() -> (
    None
):
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    old, new = shared.handle(), shared.handle()
    epoch = await old.try_acquire_lease("a", 2000)
    assert epoch is not None
    old.fence(epoch)
    term = _Term(old)

    async def stop_renewing() -> None:
        return None

    async def successor() -> None:
        await clock.sleep(0.005)  # the handover released the lease by then
        taken = await new.try_acquire_lease("b", 2000)
        assert taken is not None
        new.fence(taken)
        for n in range(5):  # its takeover's other writes come first, over some time
            await clock.sleep(0.002)
            await new.write(WriteBatch().put(TABLE_KV, b"other-%d" % n, b"x"))
        record = json.dumps({"holder": "b", "epoch": taken}).encode()
        await new.write(WriteBatch().put(TABLE_KV, RECORD_KEY, record))

    taking = asyncio.create_task(successor())
    handing = asyncio.create_task(
        lead_handover(
            store=old, ha=old, clock=clock, holder="a", epoch=epoch, to="", ttl_s=2.0,
            take_s=1.0, term=term, stop_renewing=stop_renewing,
        )
    )  # fmt: skip
    await clock.advance_until(handing.done, 0.001)
    await taking
    result = await handing
    assert result.handed_over and result.successor == "b" and result.epoch == epoch + 1
    # one look at the record as the wait began; then the stream brought it (no poll)
    assert term.looks == 1
