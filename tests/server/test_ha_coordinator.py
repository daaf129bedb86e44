"""The HA lease loop (gcs.server.ha) on the fake clock, with MemoryStore(ha=True) handles
standing for GCS processes on one store and a fake term standing for the served GCS."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry

from gcs.base.clock import FakeClock
from gcs.managers.nodes import NodeManager
from gcs.proto import gcs_pb2
from gcs.server.ha import HaCoordinator, HaSettings, Role
from gcs.server.ha_mirror import MIRRORED_TABLES, TableMirror, TakeoverStore
from gcs.server.metrics import GcsMetrics
from gcs.store.base import TABLE_KV, TABLE_NODE, WriteBatch
from gcs.store.errors import StoreFenced, StoreUnavailable
from gcs.store.memory import MemoryStore
from gcs.store.metered import MeteredStore

TTL_MS, RENEW_MS = 2000, 500


class FakeTerm:
    """What the server hands the coordinator: records what the term loaded and its store."""

    def __init__(self, store: TakeoverStore, admit: Callable[[], bool]) -> None:
        self.store = store
        self.admit = admit
        self.stopped = False
        self.failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def wait(self) -> None:
        await self.failure

    async def stop(self) -> None:
        self.stopped = True


class FakeLocks:
    """Same-host lock files (gcs.server.ha_lock) of every member of one host: a holder's
    lock is held while its event is unset; :meth:`kill` is its process dying."""

    def __init__(
        self,
        host: dict[str, asyncio.Event] | None = None,
        records: dict[str, tuple[str, int]] | None = None,
        ended: list[str] | None = None,
    ) -> None:
        self.host = {} if host is None else host
        self.records = {} if records is None else records
        """Each holder's role and epoch as its lock record says."""
        self.ended = [] if ended is None else ended
        self.mine: str | None = None

    def on_same_host(self) -> FakeLocks:
        return FakeLocks(self.host, self.records, self.ended)

    async def hold(self, holder: str) -> None:
        self.host[holder] = asyncio.Event()
        self.mine = holder

    def release(self) -> None:
        if self.mine is not None:
            self.host.pop(self.mine).set()

    def watch(self, holder: str) -> Awaitable[None] | None:
        died = self.host.get(holder)
        return None if died is None or died.is_set() else died.wait()

    def kill(self, holder: str) -> None:
        self.host[holder].set()

    def mark(self, role: str, epoch: int) -> None:
        if self.mine is not None:
            self.records[self.mine] = (role, epoch)

    def end(self, holder: str, epoch: int) -> int | None:
        """A stalled holder is ended (its lock dropped) if its record says it leads."""
        if self.records.get(holder) != ("leader", epoch) or self.host[holder].is_set():
            return None
        self.ended.append(holder)
        self.kill(holder)
        return 4242


class Member:
    def __init__(
        self,
        name: str,
        store: MemoryStore,
        clock: FakeClock,
        *,
        load_s: float = 0.0,
        locks: FakeLocks | None = None,
    ) -> None:
        self.name = name
        self.store = store
        self.clock = clock
        self.load_s = load_s
        self.terms: list[FakeTerm] = []
        self.loaded_nodes: list[dict[bytes, bytes]] = []
        self.coordinator = HaCoordinator(
            store,
            clock,
            HaSettings(name, TTL_MS, RENEW_MS),
            start_term=self._start_term,
            metrics=GcsMetrics(),
            locks=locks,
        )
        self.task: asyncio.Task[None] | None = None

    async def _start_term(self, store: TakeoverStore, admit: Callable[[], bool]) -> FakeTerm:
        self.loaded_nodes.append(await store.get_all(TABLE_NODE))  # from the mirror
        await self.clock.sleep(self.load_s)  # a big state takes a while to load
        store.release_mirror()
        term = FakeTerm(store, admit)
        self.terms.append(term)
        return term

    def start(self) -> Member:
        self.task = asyncio.create_task(self.coordinator.run())
        return self

    @property
    def leader(self) -> bool:
        return self.coordinator.role is Role.LEADER

    @property
    def term(self) -> FakeTerm:
        return self.terms[-1]


@pytest.fixture
async def group() -> AsyncIterator[Callable[..., Member]]:
    members: list[Member] = []

    def make(
        name: str,
        store: MemoryStore,
        clock: FakeClock,
        load_s: float = 0.0,
        locks: FakeLocks | None = None,
    ) -> Member:
        member = Member(name, store, clock, load_s=load_s, locks=locks)
        members.append(member)
        return member

    yield make
    for member in members:
        if member.task is not None:
            member.task.cancel()
            await asyncio.gather(member.task, return_exceptions=True)


def _node(n: int) -> WriteBatch:
    return WriteBatch().put(TABLE_NODE, b"n%d" % n, b"v%d" % n)


async def test_one_leader_and_a_warm_standby_that_takes_over_when_the_lease_lapses(
    group: Callable[..., Member],
) -> None:
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    await shared.write(_node(0))  # before anyone started: loaded
    a = group("a", shared.handle(), clock).start()
    await clock.advance_until(lambda: a.leader, 0.05)
    b = group("b", shared.handle(), clock).start()
    await b.coordinator.warm()
    assert a.loaded_nodes == [{b"n0": b"v0"}]
    await a.term.store.write(_node(1))  # the leader writes; the standby follows
    await a.term.store.write(WriteBatch().put(TABLE_KV, b"k", b"v"))  # not mirrored
    await clock.run_for(1.0, 0.05)
    assert b.coordinator.mirror is not None
    assert b.coordinator.mirror.tables[TABLE_NODE] == {b"n0": b"v0", b"n1": b"v1"}
    assert TABLE_KV not in b.coordinator.mirror.tables
    assert not b.leader and a.leader and a.term.admit()

    # a is partitioned from the store (its renewals fail): it stops answering within
    # its trusted lease, b takes over after the TTL, and a steps down
    a.store.fail_writes = True
    start = clock.monotonic_s()
    await clock.advance_until(lambda: not a.term.admit(), 0.05)
    assert clock.monotonic_s() - start <= TTL_MS / 1000
    await clock.advance_until(lambda: b.leader, 0.05)
    assert not a.leader and a.term.stopped, "a stepped down before the store let b in"
    assert clock.monotonic_s() - start <= (TTL_MS + RENEW_MS) / 1000 + 0.1
    assert b.loaded_nodes == [{b"n0": b"v0", b"n1": b"v1"}]  # from its warm mirror
    assert b.coordinator.epoch > a.coordinator.epoch
    assert a.coordinator.step_downs == 1
    # a's store comes back: it is a standby again, and its late writes are refused
    a.store.fail_writes = False
    with pytest.raises(StoreUnavailable, match="nothing was written"):
        await a.term.store.write(_node(99))  # the ended term's store is cut
    with pytest.raises(StoreFenced):
        await a.store.write(_node(99))
    assert await shared.get(TABLE_NODE, b"n99") is None
    await clock.advance_until(lambda: a.coordinator.mirror is not None, 0.05)
    await clock.run_for(3 * TTL_MS / 1000, 0.1)
    assert b.leader and not a.leader


async def test_a_fenced_write_steps_the_leader_down_at_once(group: Callable[..., Member]) -> None:
    """A paused leader resumed after another took the lease: its first write is refused in
    the store and it steps down without waiting for its renewal loop."""
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    a = group("a", shared.handle(), clock).start()
    await clock.advance_until(lambda: a.leader, 0.05)
    thief = shared.handle()
    clock.advance(TTL_MS / 1000 + 0.01)  # a was paused: nothing of it ran yet
    assert not a.term.admit(), "past its trusted lease: refuses before any task runs"
    assert await thief.try_acquire_lease("thief", TTL_MS) is not None
    with pytest.raises(StoreFenced):
        await a.term.store.write(_node(1))
    for _ in range(50):  # no time passes: the refusal itself ends the term
        if a.term.stopped:
            break
        await asyncio.sleep(0)
    assert not a.leader and a.term.stopped
    assert await shared.get(TABLE_NODE, b"n1") is None


async def test_racing_standbys_elect_exactly_one_leader(group: Callable[..., Member]) -> None:
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    members = [group(name, shared.handle(), clock).start() for name in "abcd"]
    for _ in range(40):
        await clock.run_for(0.25, 0.05)
        assert sum(m.leader for m in members) <= 1
    assert sum(m.leader for m in members) == 1
    leader = next(m for m in members if m.leader)
    # the leader dies without releasing (its store handle is gone): exactly one other wins
    leader.store.fail_writes = True
    await clock.advance_until(lambda: sum(m.leader for m in members if m is not leader) == 1, 0.05)
    for _ in range(20):
        await clock.run_for(0.25, 0.05)
        assert sum(m.leader for m in members) <= 1


async def test_a_clean_stop_releases_the_lease_and_a_standby_takes_over_without_the_ttl(
    group: Callable[..., Member],
) -> None:
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    a = group("a", shared.handle(), clock).start()
    await clock.advance_until(lambda: a.leader, 0.05)
    b = group("b", shared.handle(), clock).start()
    await b.coordinator.warm()
    assert a.task is not None
    a.task.cancel()
    await asyncio.gather(a.task, return_exceptions=True)
    assert a.term.stopped
    start = clock.monotonic_s()
    await clock.advance_until(lambda: b.leader, 0.05)
    assert clock.monotonic_s() - start <= RENEW_MS / 1000 + 0.1


async def test_a_standby_behind_a_trimmed_stream_reloads(group: Callable[..., Member]) -> None:
    clock = FakeClock()
    shared = MemoryStore(clock=clock, max_changes=3)
    a = group("a", shared.handle(), clock).start()
    await clock.advance_until(lambda: a.leader, 0.05)
    b_store = shared.handle()
    b = group("b", b_store, clock).start()
    await b.coordinator.warm()
    b_store.fail_writes = True  # cannot take the lease; reads still work
    for n in range(10):  # more than the stream keeps, in one go: b misses some
        await a.term.store.write(_node(n))
    await clock.run_for(1.0, 0.05)
    assert b.coordinator.mirror is not None
    assert len(b.coordinator.mirror.tables[TABLE_NODE]) == 10


async def test_a_term_that_fails_for_another_reason_is_raised(group: Callable[..., Member]) -> None:
    clock = FakeClock()
    a = group("a", MemoryStore(clock=clock), clock).start()
    await clock.advance_until(lambda: a.leader, 0.05)
    a.term.failure.set_exception(RuntimeError("component broke"))
    assert a.task is not None
    with pytest.raises(RuntimeError, match="component broke"):
        await a.task


async def test_the_mirror_applies_only_mirrored_tables_and_its_own_writes() -> None:
    store = MemoryStore()
    await store.write(_node(1).put(TABLE_KV, b"k", b"v"))
    mirror = TableMirror()
    await mirror.load(store)
    assert set(mirror.tables) == set(MIRRORED_TABLES)
    await store.write(WriteBatch().delete(TABLE_NODE, b"n1").put(TABLE_NODE, b"n2", b"v2"))
    assert await mirror.drain(store) == 2
    assert mirror.tables[TABLE_NODE] == {b"n2": b"v2"}
    fenced: list[bool] = []
    term = TakeoverStore(store, mirror, on_fenced=lambda: fenced.append(True))
    await term.write(_node(3))
    assert await term.get_all(TABLE_NODE) == {b"n2": b"v2", b"n3": b"v3"}
    assert await term.get(TABLE_KV, b"k") == b"v"  # not mirrored: the store's
    term.release_mirror()
    await store.write(_node(4))
    assert b"n4" in await term.get_all(TABLE_NODE)
    assert not fenced


async def test_the_mirror_keeps_the_node_table_parsed_for_the_takeovers_load() -> None:
    """Rows parsed as they arrive (load, followed changes, the term's own writes); the
    term's node load adopts them; a row that does not parse leaves the parsing to the load
    (which then fails or repairs as a cold start would)."""

    def node(n: int, state: int = gcs_pb2.GcsNodeInfo.ALIVE) -> gcs_pb2.GcsNodeInfo:
        return gcs_pb2.GcsNodeInfo(node_id=b"%28d" % n, state=state)  # type: ignore[arg-type]

    def put(*nodes: gcs_pb2.GcsNodeInfo) -> WriteBatch:
        batch = WriteBatch()
        for info in nodes:
            batch.put(TABLE_NODE, info.node_id, info.SerializeToString())
        return batch

    store = MemoryStore()
    await store.write(put(node(1), node(2)))
    mirror = TableMirror()
    await mirror.load(store)
    dead = node(2, gcs_pb2.GcsNodeInfo.DEAD)
    await store.write(put(dead, node(3)).delete(TABLE_NODE, node(1).node_id))
    await mirror.drain(store)
    term = TakeoverStore(store, mirror, on_fenced=lambda: None)
    await term.write(put(node(4)))
    ready = term.decoded_rows(TABLE_NODE)
    assert ready is not None
    assert ready == {n.node_id: n for n in (dead, node(3), node(4))}
    assert term.decoded_rows(TABLE_KV) is None

    nodes = NodeManager(MeteredStore(term, CollectorRegistry()), FakeClock())
    await nodes.load()  # through the metrics wrapper, as the wiring hands it the store
    assert set(nodes.alive) == {node(3).node_id, node(4).node_id}
    assert nodes.alive[node(3).node_id] is ready[node(3).node_id], "adopted, not parsed"
    assert set(nodes.dead) == {dead.node_id}
    term.release_mirror()
    assert term.decoded_rows(TABLE_NODE) is None

    await store.write(WriteBatch().put(TABLE_NODE, b"bad", b"\xff\xff"))
    await mirror.drain(store)
    assert TABLE_NODE not in mirror.decoded
    assert mirror.tables[TABLE_NODE][b"bad"] == b"\xff\xff"


async def test_a_term_that_loads_for_longer_than_the_lease_keeps_it(
    group: Callable[..., Member],
) -> None:
    """Renewals run while the term loads (50,000 nodes take seconds): the lease does not
    lapse under a loading leader, and a standby does not take it meanwhile."""
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    a = group("a", shared.handle(), clock, load_s=3 * TTL_MS / 1000).start()
    await clock.advance_until(lambda: a.coordinator.role is Role.LEADER, 0.05)
    b = group("b", shared.handle(), clock).start()
    await clock.advance_until(lambda: a.coordinator.serving, 0.05)
    assert a.term.admit() and not b.leader
    await clock.run_for(2 * TTL_MS / 1000, 0.05)
    assert a.leader and not b.leader and a.coordinator.step_downs == 0


async def test_a_leader_dead_on_the_same_host_is_replaced_before_its_ttl(
    group: Callable[..., Member],
) -> None:
    """Its lock file released (the kernel does that when a process dies): the standby frees
    the dead holder's lease and takes over at once, not after the TTL."""
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    host = FakeLocks()
    a = group("a", shared.handle(), clock, locks=host.on_same_host()).start()
    await clock.advance_until(lambda: a.leader, 0.05)
    b = group("b", shared.handle(), clock, locks=host.on_same_host()).start()
    await b.coordinator.warm()
    await clock.run_for(1.0, 0.05)  # b watches a's lock meanwhile
    a_epoch = a.coordinator.epoch
    a.store.fail_writes = True  # a is gone: no renewal, no release
    host.kill("a")
    start = clock.monotonic_s()
    await clock.advance_until(lambda: b.leader, 0.01)
    assert clock.monotonic_s() - start <= 0.1, "waited for the lease's TTL"
    assert b.coordinator.fast_takeovers == 1
    assert b.coordinator.epoch > a_epoch
    with pytest.raises(StoreFenced):  # fencing holds as ever
        a.store.fail_writes = False
        await a.term.store.write(_node(1))


async def test_a_paused_leader_or_one_on_another_host_still_waits_for_the_ttl(
    group: Callable[..., Member],
) -> None:
    """A paused leader keeps its lock (only death drops it); a leader with no lock file on
    this host gives nothing to watch: either way the lease's TTL decides."""
    for other_host in (False, True):
        clock = FakeClock()
        shared = MemoryStore(clock=clock)
        host = FakeLocks()
        a_locks = FakeLocks() if other_host else host.on_same_host()
        a = group("a", shared.handle(), clock, locks=a_locks).start()
        await clock.advance_until(lambda: a.leader, 0.05)  # noqa: B023
        b = group("b", shared.handle(), clock, locks=host.on_same_host()).start()
        await b.coordinator.warm()
        await clock.run_for(1.0, 0.05)
        a.store.fail_writes = True  # no renewals reach the store; the lock stays held
        start = clock.monotonic_s()
        await clock.advance_until(lambda: b.leader, 0.05)  # noqa: B023
        assert clock.monotonic_s() - start >= TTL_MS / 1000 * 0.75
        assert b.coordinator.fast_takeovers == 0


async def test_the_server_hears_of_each_full_mirror_load_before_the_member_is_warm() -> None:
    """(The server freezes its start-up heap there, off the takeover's path.)"""
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    loaded: list[bool] = []
    coordinator = HaCoordinator(
        shared.handle(),
        clock,
        HaSettings("a", TTL_MS, RENEW_MS),
        start_term=lambda store, admit: asyncio.sleep(3600),  # type: ignore[arg-type,return-value]
        on_mirror_loaded=lambda: loaded.append(coordinator.mirror is not None),
    )
    task = asyncio.create_task(coordinator.run())
    try:
        await coordinator.warm()
        assert loaded == [True]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
