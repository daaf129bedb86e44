"""Property: a standby that follows the store the documented way (take a cursor, load the
tables, apply the changes after the cursor, in reads of any size) ends in exactly the
store's state, however the leader's writes interleave with those steps (hypothesis; on
the memory store and on a real Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from gcs.store import StoreConflict, WriteBatch
from gcs.store.ha import ChangeCursor
from gcs.store.memory import MemoryStore
from gcs.store.redis.store import RedisStore
from gcs.testing.redis_server import RedisServer
from tests.store.conftest import AnyHaStore

TABLES = ("NODE", "JOB")
COUNTERS = ("c1", "c2")

keys = st.sampled_from([b"a", b"b", b"\x00", b"\xff"])
values = st.binary(max_size=4)
puts = st.lists(st.tuples(st.sampled_from(TABLES), keys, values), max_size=3)
deletes = st.lists(st.tuples(st.sampled_from(TABLES), keys), max_size=2)
conditions = st.lists(st.tuples(st.sampled_from(TABLES), keys, st.none() | values), max_size=1)
batches = st.builds(lambda p, d, c: ("batch", p, d, c), puts, deletes, conditions)
increments = st.builds(lambda c, n: ("inc", c, n), st.sampled_from(COUNTERS), st.integers(1, 3))
writes = st.lists(batches | increments, max_size=25)


@dataclass
class Follower:
    """A standby's copy: tables and counters, loaded then kept up by the change stream."""

    tables: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    cursor: ChangeCursor = b"0"

    async def follow(self, store: AnyHaStore, limit: int) -> None:
        self.cursor, changes = await store.read_changes(self.cursor, limit=limit)
        for change in changes:
            if change.table == "":
                self.counters[change.key.decode()] = int(change.value or b"0")
            elif change.value is None:
                self.tables[change.table].pop(change.key, None)
            else:
                self.tables[change.table][change.key] = change.value


@st.composite
def scripts(draw: st.DrawFn) -> tuple[list[tuple], list[int], list[int]]:
    """Writes, where the follower's steps fall among them (cursor, load of each table,
    load of the counters: in that order, any gaps), and read sizes for the applying."""
    ops = draw(writes)
    marks = sorted(draw(st.lists(st.integers(0, len(ops)), min_size=4, max_size=4)))
    limits = draw(st.lists(st.integers(1, 6), max_size=8))
    return ops, marks, limits


async def _write(store: AnyHaStore, op: tuple) -> None:
    if op[0] == "inc":
        await store.increment(op[1], op[2])
        return
    batch = WriteBatch()
    for table, key, value in op[1]:
        batch.put(table, key, value)
    for table, key in op[2]:
        batch.delete(table, key)
    for table, key, expected in op[3]:
        batch.expect(table, key, expected)
    with contextlib.suppress(StoreConflict):  # a failed condition: no change, no entry
        await store.write(batch)


async def _converges(
    open_pair: Callable[[], Awaitable[tuple[AnyHaStore, AnyHaStore]]],
    script: tuple[list[tuple], list[int], list[int]],
) -> None:
    ops, marks, limits = script
    leader, standby = await open_pair()
    try:
        follower = Follower()
        steps: dict[int, list[Callable[[], Awaitable[None]]]] = {}

        async def take_cursor() -> None:
            follower.cursor = await standby.change_cursor()

        def load(table: str) -> Callable[[], Awaitable[None]]:
            async def step() -> None:
                follower.tables[table] = await standby.get_all(table)

            return step

        async def load_counters() -> None:
            for name in COUNTERS:
                follower.counters[name] = await standby.read_counter(name)

        order = [take_cursor, load(TABLES[0]), load(TABLES[1]), load_counters]
        for at, step in zip(marks, order, strict=True):
            steps.setdefault(at, []).append(step)
        pending_limits = list(limits)
        for at in range(len(ops) + 1):
            for step in steps.get(at, []):
                await step()
            if at >= marks[-1] and pending_limits:  # loaded: apply as the writes go on
                await follower.follow(standby, pending_limits.pop())
            if at < len(ops):
                await _write(leader, ops[at])
        while True:
            before = follower.cursor
            await follower.follow(standby, 5)
            if follower.cursor == before:
                break
        for table in TABLES:
            assert follower.tables[table] == await leader.get_all(table), table
        for name in COUNTERS:
            assert follower.counters[name] == await leader.read_counter(name), name
    finally:
        await leader.close()
        await standby.close()


class TestFollowProtocol:
    @settings(deadline=None)
    @given(scripts())
    def test_a_follower_converges_on_the_memory_store(
        self, script: tuple[list[tuple], list[int], list[int]]
    ) -> None:
        """Any interleaving of writes with cursor / loads / applies: the same state."""

        async def pair() -> tuple[AnyHaStore, AnyHaStore]:
            root = MemoryStore()
            return root, root.handle()

        asyncio.run(_converges(pair, script))

    @settings(max_examples=25, deadline=None)
    @given(script=scripts())
    def test_a_follower_converges_on_redis(
        self, redis_server: RedisServer, script: tuple[list[tuple], list[int], list[int]]
    ) -> None:
        """The same on a real Redis (two store objects, a fresh namespace per example)."""

        async def pair() -> tuple[AnyHaStore, AnyHaStore]:
            namespace = f"f{uuid.uuid4().hex[:12]}"
            stores = [RedisStore(redis_server.url, namespace=namespace, ha=True) for _ in "ab"]
            for store in stores:
                await store.open()
            return stores[0], stores[1]

        asyncio.run(_converges(pair, script))
