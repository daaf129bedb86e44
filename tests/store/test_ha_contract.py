"""One contract for what every store offers ``gcs serve --ha`` (``gcs.store.ha``): the
leader lease, fencing, and the change stream; on memory, SQLite, PostgreSQL, Redis,
Redis Sentinel and Redis Cluster alike."""

from __future__ import annotations

import asyncio

import pytest

from gcs.store import StoreConflict, WriteBatch
from gcs.store.ha import Change, ChangeCursor, ChangesTrimmed, StoreFenced
from gcs.store.ha_parts import cursor_of, seq_of
from tests.store.conftest import AnyHaStore, HaBackend

TTL_MS = 60_000
"""Long: a lease lapses only when a test makes it (``HaBackend.expire_lease``)."""
FOREVER_MS = 600_000
"""A blocking read that only a write can end within the test's time."""


async def read_all(store: AnyHaStore, cursor: ChangeCursor) -> tuple[ChangeCursor, list[Change]]:
    """Every change after ``cursor`` (reading until nothing is left)."""
    changes: list[Change] = []
    while True:
        cursor, more = await store.read_changes(cursor)
        if not more:
            return cursor, changes
        changes += more


async def leader(backend: HaBackend, holder: str) -> tuple[AnyHaStore, int]:
    """A new handle that holds the lease (taking it over if needed) and is fenced at it."""
    store = await backend.open()
    epoch = await store.try_acquire_lease(holder, TTL_MS)
    if epoch is None:
        await backend.expire_lease(store)
        epoch = await store.try_acquire_lease(holder, TTL_MS)
    assert epoch is not None
    store.fence(epoch)
    return store, epoch


class TestLease:
    """One lease per namespace, granted with ever-growing epochs, expiring on the store's
    clock."""

    async def test_a_first_acquire_grants_an_epoch_that_read_lease_shows(
        self, ha_backend: HaBackend
    ) -> None:
        """No lease before; then holder, epoch and a remaining time within the TTL."""
        store = await ha_backend.open()
        assert await store.read_lease() is None
        epoch = await store.try_acquire_lease("a", TTL_MS)
        assert epoch is not None and epoch >= 1
        info = await store.read_lease()
        assert info is not None
        assert (info.holder, info.epoch) == ("a", epoch)
        assert 0 < info.remaining_ms <= TTL_MS

    async def test_a_live_lease_is_refused_to_others_and_renewed_only_for_its_holder(
        self, ha_backend: HaBackend
    ) -> None:
        """Another holder gets None and cannot renew; the holder renews its own epoch only."""
        a, b = await ha_backend.open(), await ha_backend.open()
        epoch = await a.try_acquire_lease("a", TTL_MS)
        assert epoch is not None
        assert await b.try_acquire_lease("b", TTL_MS) is None
        assert await b.renew_lease("b", epoch, TTL_MS) is False
        assert await a.renew_lease("a", epoch + 1, TTL_MS) is False
        assert await b.renew_lease("a", epoch, TTL_MS) is True  # any handle of the holder
        info = await a.read_lease()
        assert info is not None and (info.holder, info.epoch) == ("a", epoch)

    async def test_epochs_strictly_increase_across_acquire_expiry_release_and_reacquire(
        self, ha_backend: HaBackend
    ) -> None:
        """Re-acquiring one's own lease, taking over a lapsed one, taking a released one:
        every grant has a greater epoch than all before."""
        a, b = await ha_backend.open(), await ha_backend.open()
        epochs = [await a.try_acquire_lease("a", TTL_MS)]
        epochs.append(await a.try_acquire_lease("a", TTL_MS))
        await ha_backend.expire_lease(a)
        epochs.append(await b.try_acquire_lease("b", TTL_MS))
        await ha_backend.expire_lease(a)
        epochs.append(await a.try_acquire_lease("a", TTL_MS))
        await a.release_lease("a", epochs[-1])  # type: ignore[arg-type]
        epochs.append(await b.try_acquire_lease("b", TTL_MS))
        assert None not in epochs
        assert epochs == sorted(set(epochs)), epochs  # type: ignore[type-var]

    async def test_renew_after_expiry_and_takeover_returns_false(
        self, ha_backend: HaBackend
    ) -> None:
        """The lapsed holder's renewal fails and leaves the new holder's lease alone."""
        a, b = await ha_backend.open(), await ha_backend.open()
        old = await a.try_acquire_lease("a", TTL_MS)
        await ha_backend.expire_lease(a)
        new = await b.try_acquire_lease("b", TTL_MS)
        assert old is not None and new is not None and new > old
        assert await a.renew_lease("a", old, TTL_MS) is False
        info = await a.read_lease()
        assert info is not None and (info.holder, info.epoch) == ("b", new)
        assert info.remaining_ms > 0

    async def test_a_lapsed_lease_nobody_took_is_renewed_by_its_holder(
        self, ha_backend: HaBackend
    ) -> None:
        """No newer epoch was granted, so the holder may keep it (no needless takeover)."""
        a, b = await ha_backend.open(), await ha_backend.open()
        epoch = await a.try_acquire_lease("a", TTL_MS)
        assert epoch is not None
        await ha_backend.expire_lease(a)
        assert await a.renew_lease("a", epoch, TTL_MS) is True
        assert await b.try_acquire_lease("b", TTL_MS) is None
        info = await b.read_lease()
        assert info is not None and (info.holder, info.epoch) == ("a", epoch)

    async def test_a_renewal_arriving_with_too_little_left_is_refused(
        self, ha_backend: HaBackend
    ) -> None:
        """Issue 29 item 3: ``min_left_ms`` refuses a renewal that reaches the store after
        its leader stopped trusting the lease (a lapsed one included); the lease is left as
        it was, and a live one with enough left is renewed."""
        a = await ha_backend.open()
        epoch = await a.try_acquire_lease("a", TTL_MS)
        assert epoch is not None
        assert await a.renew_lease("a", epoch, TTL_MS, min_left_ms=TTL_MS // 10) is True
        assert await a.renew_lease("a", epoch, TTL_MS, min_left_ms=TTL_MS * 2) is False
        await ha_backend.expire_lease(a)
        assert await a.renew_lease("a", epoch, TTL_MS, min_left_ms=1) is False
        assert await a.try_acquire_lease("b", TTL_MS) is not None  # it stayed lapsed

    async def test_release_frees_the_lease_only_for_its_holder_and_epoch(
        self, ha_backend: HaBackend
    ) -> None:
        """A release naming someone else or an old epoch changes nothing; the holder's
        frees the lease at once."""
        a, b = await ha_backend.open(), await ha_backend.open()
        epoch = await a.try_acquire_lease("a", TTL_MS)
        assert epoch is not None
        await b.release_lease("b", epoch)
        await b.release_lease("a", epoch - 1)
        assert await b.try_acquire_lease("b", TTL_MS) is None
        await a.release_lease("a", epoch)
        taken = await b.try_acquire_lease("b", TTL_MS)
        assert taken is not None and taken > epoch

    async def test_exactly_one_of_many_concurrent_acquirers_wins(
        self, ha_backend: HaBackend
    ) -> None:
        """Eight handles race for a free lease, three rounds: one winner each round, with
        the next epoch."""
        stores = [await ha_backend.open() for _ in range(8)]
        last = 0
        for _ in range(3):
            results = await asyncio.gather(
                *(s.try_acquire_lease(f"h{i}", TTL_MS) for i, s in enumerate(stores))
            )
            winners = [r for r in results if r is not None]
            assert len(winners) == 1, results
            assert winners[0] > last
            last = winners[0]
            holder = f"h{results.index(last)}"
            info = await stores[0].read_lease()
            assert info is not None and (info.holder, info.epoch) == (holder, last)
            await ha_backend.expire_lease(stores[0])

    async def test_bad_lease_arguments_are_refused(self, ha_backend: HaBackend) -> None:
        """An empty holder, a TTL below 1 ms, an epoch below 1: ValueError."""
        store = await ha_backend.open()
        with pytest.raises(ValueError):
            await store.try_acquire_lease("", TTL_MS)
        with pytest.raises(ValueError):
            await store.try_acquire_lease("a", 0)
        with pytest.raises(ValueError):
            await store.renew_lease("a", 1, -5)
        with pytest.raises(ValueError):
            store.fence(0)


class TestFencing:
    """A fenced store object's writes carry its epoch; once a newer one exists they are
    refused in the same atomic step, and nothing is written."""

    async def test_a_fenced_leader_writes_while_its_epoch_is_current(
        self, ha_backend: HaBackend
    ) -> None:
        """Writes and increments pass; a later re-grant to the same holder is a new epoch
        that the old fence does not cover."""
        store, epoch = await leader(ha_backend, "a")
        await store.put("KV", b"k", b"1")
        assert await store.increment("c") == 1
        renewed = await store.try_acquire_lease("a", TTL_MS)
        assert renewed == epoch + 1
        with pytest.raises(StoreFenced):
            await store.put("KV", b"k", b"2")
        store.fence(renewed)
        await store.put("KV", b"k", b"3")
        assert await store.get("KV", b"k") == b"3"

    async def test_a_deposed_leaders_write_and_increment_are_refused_and_write_nothing(
        self, ha_backend: HaBackend
    ) -> None:
        """StoreFenced names both epochs; data, counters and the stream are untouched,
        even for a batch whose condition would fail (the fence is checked first)."""
        old, old_epoch = await leader(ha_backend, "a")
        await old.put("KV", b"k", b"1")
        new, new_epoch = await leader(ha_backend, "b")
        cursor = await new.change_cursor()
        batch = WriteBatch().put("KV", b"k", b"2").put("KV", b"fresh", b"x").delete("KV", b"k")
        with pytest.raises(StoreFenced) as info:
            await old.write(batch)
        assert (info.value.fence_epoch, info.value.current_epoch) == (old_epoch, new_epoch)
        with pytest.raises(StoreFenced):
            await old.increment("c", 5)
        with pytest.raises(StoreFenced):
            await old.write(WriteBatch().put("KV", b"k", b"3").expect("KV", b"k", b"no"))
        assert await new.get_all("KV") == {b"k": b"1"}
        assert await new.read_counter("c") == 0
        assert await new.change_cursor() == cursor
        assert await new.read_changes(cursor) == (cursor, [])
        await new.put("KV", b"k", b"4")
        assert await old.get("KV", b"k") == b"4"  # reads are never fenced

    async def test_fencing_one_handle_leaves_the_others_alone(self, ha_backend: HaBackend) -> None:
        """Of three handles on one namespace, only the one fenced at the old epoch is
        refused: the new leader and a never-fenced handle write."""
        old, _ = await leader(ha_backend, "a")
        bystander = await ha_backend.open()
        new, _ = await leader(ha_backend, "b")
        with pytest.raises(StoreFenced):
            await old.put("KV", b"x", b"old")
        await new.put("KV", b"x", b"new")
        await bystander.put("KV", b"y", b"bystander")
        assert await bystander.get_all("KV") == {b"x": b"new", b"y": b"bystander"}

    async def test_a_deposed_leader_can_still_learn_whether_its_last_write_landed(
        self, ha_backend: HaBackend
    ) -> None:
        """``landed`` is not fenced: it writes no data, and the answer is needed to tell a
        client the truth while stepping down."""
        old, _ = await leader(ha_backend, "a")
        batch = WriteBatch().put("KV", b"k", b"v")
        await old.write(batch)
        await leader(ha_backend, "b")
        assert await old.landed(batch.write_id) is True

    async def test_writes_in_flight_while_the_lease_moves_land_before_it_or_not_at_all(
        self, ha_backend: HaBackend
    ) -> None:
        """Four writers of a leader keep creating keys while another handle takes the
        lease over and writes a marker: every acknowledged key is stored and precedes the
        marker in the change stream; every refused one is nowhere; every write begun after
        the takeover returned is refused."""
        old, _ = await leader(ha_backend, "a")
        new = await ha_backend.open()
        cursor = await new.change_cursor()
        outcome: dict[bytes, bool] = {}
        begun_after: set[bytes] = set()
        moved, some_landed = asyncio.Event(), asyncio.Event()

        async def writer(w: int) -> None:
            for i in range(2000):  # bounded: a store that never refuses fails, not hangs
                await asyncio.sleep(0)  # a yield: memory writes never suspend
                key = b"w%d-%d" % (w, i)
                if moved.is_set():
                    begun_after.add(key)
                try:
                    await old.put("KV", key, b"a")
                except StoreFenced:
                    outcome[key] = False
                    return
                outcome[key] = True
                if sum(outcome.values()) >= 12:
                    some_landed.set()

        async def take_over() -> None:
            await some_landed.wait()
            await ha_backend.expire_lease(new)
            epoch = await new.try_acquire_lease("b", TTL_MS)
            assert epoch is not None
            new.fence(epoch)
            moved.set()
            await new.put("KV", b"marker", b"b")

        await asyncio.gather(*(writer(w) for w in range(4)), take_over())
        assert list(outcome.values()).count(False) == 4  # every writer was refused, once
        assert all(not outcome[key] for key in begun_after)
        with pytest.raises(StoreFenced):
            await old.put("KV", b"late", b"a")
        stored = await new.get_all("KV")
        order = [change.key for change in (await read_all(new, cursor))[1]]
        marker = order.index(b"marker")
        for key, landed in outcome.items():
            assert (key in stored) is landed, key
            if landed:
                assert order.index(key) < marker, key
            else:
                assert key not in order, key
        assert b"late" not in stored and b"late" not in order


class TestChangeStream:
    """Every applied batch, in order, with final values; nothing else; bounded."""

    async def test_every_applied_batch_is_streamed_in_order_with_final_values(
        self, ha_backend: HaBackend
    ) -> None:
        """Puts, deletes, a key put twice, put-then-delete in one batch, counters and odd
        binary keys; conflicting and condition-only batches leave no trace."""
        writer, follower = await ha_backend.open(), await ha_backend.open()
        cursor = await follower.change_cursor()
        await writer.write(
            WriteBatch().put("NODE", b"n", b"1").put("KV", b"k", b"a").put("KV", b"k", b"b")
        )
        await writer.write(
            WriteBatch().put("KV", b"x", b"1").delete("KV", b"x").delete("NODE", b"n")
        )
        assert await writer.increment("JobCounter", 2) == 2
        with pytest.raises(StoreConflict):
            await writer.write(WriteBatch().put("KV", b"no", b"1").expect("KV", b"k", b"zz"))
        await writer.write(WriteBatch().expect("KV", b"k", b"b"))
        await writer.put("KV", b"\x00\xff*", b"\x00")
        assert await writer.increment("JobCounter") == 3
        end, changes = await read_all(follower, cursor)
        assert changes == [
            Change("NODE", b"n", b"1"),
            Change("KV", b"k", b"b"),
            Change("KV", b"x", None),
            Change("NODE", b"n", None),
            Change("", b"JobCounter", b"2"),
            Change("KV", b"\x00\xff*", b"\x00"),
            Change("", b"JobCounter", b"3"),
        ]
        assert end == await writer.change_cursor()
        assert seq_of(end) == seq_of(cursor) + 5
        assert await follower.read_changes(end) == (end, [])

    async def test_reads_return_whole_batches_up_to_the_limit(self, ha_backend: HaBackend) -> None:
        """limit counts changes but never splits a batch; one bigger than the limit comes
        alone; following the cursors reads everything once."""
        store = await ha_backend.open()
        start = await store.change_cursor()
        sizes = [2, 2, 3]
        for n, size in enumerate(sizes):
            await store.put_many("KV", {b"%d-%d" % (n, i): b"v" for i in range(size)})
        cursor, first = await store.read_changes(start, limit=3)
        assert len(first) == 2 and seq_of(cursor) == seq_of(start) + 1
        cursor, second = await store.read_changes(cursor, limit=1)
        assert len(second) == 2
        cursor, rest = await store.read_changes(cursor, limit=100)
        assert len(rest) == 3
        assert cursor == await store.change_cursor()
        assert [c.key for c in first + second + rest] == [
            b"%d-%d" % (n, i) for n, size in enumerate(sizes) for i in range(size)
        ]

    async def test_a_blocked_reader_wakes_on_another_handles_write(
        self, ha_backend: HaBackend
    ) -> None:
        """A read blocking "forever" returns the write as soon as it is made (memory's
        fake clock never moves here: only the write can end the wait)."""
        reader, writer = await ha_backend.open(), await ha_backend.open()
        cursor = await reader.change_cursor()
        pending = asyncio.create_task(reader.read_changes(cursor, block_ms=FOREVER_MS))
        await writer.put("KV", b"k", b"v")
        end, changes = await pending
        assert changes == [Change("KV", b"k", b"v")]
        assert end == await writer.change_cursor()

    async def test_a_blocked_read_without_writes_ends_empty_after_block_ms(
        self, ha_backend: HaBackend
    ) -> None:
        """Nothing written: the cursor comes back unchanged with no changes."""
        store = await ha_backend.open()
        cursor = await store.change_cursor()
        if ha_backend.clock is None:
            assert await store.read_changes(cursor, block_ms=30) == (cursor, [])
            return
        clock = ha_backend.clock
        pending = asyncio.create_task(store.read_changes(cursor, block_ms=1000))
        await clock.advance_when_sleeping(0.5)
        assert not pending.done()
        clock.advance(0.5)
        assert await pending == (cursor, [])

    async def test_a_reader_behind_the_bound_learns_the_changes_were_trimmed(
        self, ha_backend: HaBackend
    ) -> None:
        """Well over the bound written: an old cursor raises ChangesTrimmed (blocking or
        not); a recent one still reads the last batches."""
        store = await ha_backend.open(changes_bound=10)
        start = await store.change_cursor()
        for i in range(300):
            await store.put("KV", b"k%d" % i, b"v")
        with pytest.raises(ChangesTrimmed):
            await store.read_changes(start)
        with pytest.raises(ChangesTrimmed):
            await store.read_changes(start, block_ms=FOREVER_MS)
        end = await store.change_cursor()
        cursor, changes = await store.read_changes(cursor_of(seq_of(end) - 3))
        assert cursor == end
        assert [c.key for c in changes] == [b"k297", b"k298", b"k299"]

    async def test_a_cursor_from_beyond_the_end_is_trimmed_and_garbage_is_refused(
        self, ha_backend: HaBackend
    ) -> None:
        """A cursor this store never handed out (lost changes, another store) means
        "reload"; bytes that are no cursor are a ValueError."""
        store = await ha_backend.open()
        await store.put("KV", b"k", b"v")
        end = await store.change_cursor()
        with pytest.raises(ChangesTrimmed):
            await store.read_changes(cursor_of(seq_of(end) + 5))
        with pytest.raises(ValueError):
            await store.read_changes(b"1-0")

    async def test_a_follower_converges_from_cursor_load_and_apply_under_writes(
        self, ha_backend: HaBackend
    ) -> None:
        """The follow protocol (cursor, then load, then apply changes after the cursor)
        while a writer keeps writing ends in exactly the store's state."""
        writer, follower = await ha_backend.open(), await ha_backend.open()
        await writer.put_many("NODE", {b"n%d" % i: b"0" for i in range(20)})
        writing = asyncio.Event()

        async def write(n: int) -> None:
            writing.set()
            for i in range(n):
                batch = WriteBatch().put("NODE", b"n%d" % (i % 20), b"%d" % i)
                if i % 3 == 0:
                    batch.delete("NODE", b"n%d" % ((i + 7) % 20))
                await writer.write(batch)
                if i % 5 == 0:
                    await writer.increment("c")
                await asyncio.sleep(0)

        async def follow() -> tuple[dict[bytes, bytes], int, ChangeCursor]:
            await writing.wait()
            cursor = await follower.change_cursor()
            table = await follower.get_all("NODE")
            counter = await follower.read_counter("c")
            return table, counter, cursor

        (table, counter, cursor), _ = await asyncio.gather(follow(), write(60))
        cursor, changes = await read_all(follower, cursor)
        for change in changes:
            if change.table == "":
                counter = int(change.value or b"0")
            elif change.value is None:
                table.pop(change.key, None)
            else:
                table[change.key] = change.value
        assert table == await writer.get_all("NODE")
        assert counter == await writer.read_counter("c") == 12
