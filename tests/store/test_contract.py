"""One contract for every Store backend: memory, SQLite, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gcs.store import StoreConflict, StoreOutcomeUnknown, StoreUnavailable, WriteBatch
from gcs.store.base import Store
from tests.store.conftest import Backend

# Keys that trip up naive encodings: NUL, 0xFF, glob and LIKE metacharacters, empty.
ODD_KEYS = [b"", b"\x00", b"\x00\x00", b"\xff", b"\xff\xff", b"a\x00b", b"*", b"[a]", b"%_", b"\\"]


class TestReadsAndWrites:
    """Single-key and bulk reads see exactly what was written, byte for byte."""

    async def test_get_returns_none_for_a_missing_key(self, store: Store) -> None:
        """A key never written reads as None."""
        assert await store.get("NODE", b"missing") is None

    async def test_put_then_get_round_trips_binary_keys_and_values(self, store: Store) -> None:
        """Keys and values with NUL / 0xFF / metacharacters come back unchanged."""
        for i, key in enumerate(ODD_KEYS):
            await store.put("NODE", key, bytes([i, 0, 255]) + key)
        for i, key in enumerate(ODD_KEYS):
            assert await store.get("NODE", key) == bytes([i, 0, 255]) + key

    async def test_put_overwrites_and_delete_removes(self, store: Store) -> None:
        """A second put replaces the value; delete makes the key absent; deleting twice is fine."""
        await store.put("KV", b"k", b"v1")
        await store.put("KV", b"k", b"v2")
        assert await store.get("KV", b"k") == b"v2"
        await store.delete("KV", b"k")
        await store.delete("KV", b"k")
        assert await store.get("KV", b"k") is None

    async def test_tables_are_separate(self, store: Store) -> None:
        """The same key in two tables holds two values."""
        await store.put("NODE", b"k", b"node")
        await store.put("JOB", b"k", b"job")
        assert await store.get("NODE", b"k") == b"node"
        assert await store.get_all("JOB") == {b"k": b"job"}

    async def test_multi_get_returns_only_existing_keys(self, store: Store) -> None:
        """Missing keys are left out of multi_get's result; duplicates are harmless."""
        await store.put_many("KV", {b"a": b"1", b"\x00": b"2", b"\xff": b"3"})
        got = await store.multi_get("KV", [b"a", b"nope", b"\xff", b"a", b"\x00"])
        assert got == {b"a": b"1", b"\xff": b"3", b"\x00": b"2"}
        assert await store.multi_get("KV", []) == {}

    async def test_get_all_returns_the_whole_table(self, store: Store) -> None:
        """get_all sees every key of one table, including odd binary keys."""
        items = {key: b"v" + key for key in ODD_KEYS}
        await store.put_many("KV", items)
        assert await store.get_all("KV") == items
        assert await store.get_all("EMPTY") == {}

    @pytest.mark.parametrize(
        "prefix",
        [b"", b"\x00", b"\xff", b"a", b"a\x00", b"a\xff", b"*", b"[", b"%", b"\\"],
    )
    async def test_scan_prefix_matches_bytewise_prefixes(self, store: Store, prefix: bytes) -> None:
        """scan_prefix returns exactly the keys starting with the prefix (no glob/LIKE leaks)."""
        keys = [
            *ODD_KEYS,
            b"a",
            b"ab",
            b"a\xff",
            b"a\xff\x00",
            b"a\x00",
            b"b",
            b"\xff\x00",
            b"*x",
            b"[ab",
            b"%x",
            b"\\x",
        ]
        await store.put_many("KV", {k: b"v" for k in keys})
        expected = {k: b"v" for k in keys if k.startswith(prefix)}
        assert await store.scan_prefix("KV", prefix) == expected

    @pytest.mark.parametrize("prefix", [b"", b"a", b"*", b"\xff"])
    async def test_scan_keys_lists_keys_and_gives_up_past_the_bound(
        self, store: Store, prefix: bytes
    ) -> None:
        """scan_keys lists the prefix's keys without values, and answers None (not a partial
        list) once their bytes pass ``max_bytes``."""
        keys = [b"a", b"ab", b"a\xff", b"*x", b"\xff\x00", *(b"a%03d" % i for i in range(300))]
        await store.put_many("KV", {k: b"v" * 64 for k in keys})
        expected = sorted(k for k in keys if k.startswith(prefix))
        got = await store.scan_keys("KV", prefix, max_bytes=10**6)
        assert got is not None and sorted(got) == expected
        size = sum(map(len, expected))
        assert await store.scan_keys("KV", prefix, max_bytes=size - 1) is None
        assert await store.scan_keys("KV", b"none", max_bytes=0) == []

    async def test_large_batches_are_written_and_read_in_full(self, store: Store) -> None:
        """Two thousand keys go through put_many, multi_get and get_all intact."""
        items = {i.to_bytes(4, "big"): i.to_bytes(8, "little") for i in range(2000)}
        await store.put_many("NODE", items)
        assert await store.get_all("NODE") == items
        assert await store.multi_get("NODE", list(items)) == items


class TestBatches:
    """A WriteBatch is applied all-or-nothing, conditions included."""

    async def test_batch_applies_puts_and_deletes_across_tables(self, store: Store) -> None:
        """Puts and deletes in several tables land together."""
        await store.put("JOB", b"old", b"x")
        batch = WriteBatch().put("NODE", b"n", b"1").put("JOB", b"j", b"2").delete("JOB", b"old")
        await store.write(batch)
        assert await store.get_all("NODE") == {b"n": b"1"}
        assert await store.get_all("JOB") == {b"j": b"2"}

    async def test_delete_wins_over_put_of_the_same_key_in_one_batch(self, store: Store) -> None:
        """Puts apply before deletes, so put+delete of one key leaves it absent."""
        await store.write(WriteBatch().put("KV", b"k", b"v").delete("KV", b"k"))
        assert await store.get("KV", b"k") is None

    async def test_last_put_of_a_key_in_one_batch_wins(self, store: Store) -> None:
        """Two puts of one key in a batch leave the second value."""
        await store.write(WriteBatch().put("KV", b"k", b"1").put("KV", b"k", b"2"))
        assert await store.get("KV", b"k") == b"2"

    async def test_condition_expecting_absence_passes_when_key_is_absent(
        self, store: Store
    ) -> None:
        """expect(None) on a missing key lets the batch through."""
        await store.write(WriteBatch().put("KV", b"k", b"v").expect("KV", b"k", None))
        assert await store.get("KV", b"k") == b"v"

    async def test_condition_expecting_presence_accepts_any_value_and_rejects_absence(
        self, store: Store
    ) -> None:
        """expect_present passes for any stored value (even b"") and fails on a missing key,
        applying nothing then."""
        await store.put("KV", b"k", b"")
        await store.write(WriteBatch().delete("KV", b"k").expect_present("KV", b"k"))
        assert await store.get("KV", b"k") is None
        with pytest.raises(StoreConflict):
            await store.write(WriteBatch().put("NODE", b"n", b"x").expect_present("KV", b"k"))
        assert await store.get("NODE", b"n") is None

    async def test_condition_expecting_absence_fails_when_key_exists(self, store: Store) -> None:
        """expect(None) on an existing key raises StoreConflict and applies nothing."""
        await store.put("KV", b"k", b"v")
        batch = WriteBatch().put("KV", b"k", b"new").put("NODE", b"other", b"x")
        with pytest.raises(StoreConflict) as info:
            await store.write(batch.expect("KV", b"k", None))
        assert (info.value.table, info.value.key) == ("KV", b"k")
        assert await store.get("KV", b"k") == b"v"
        assert await store.get("NODE", b"other") is None

    async def test_condition_on_value_passes_when_value_matches(self, store: Store) -> None:
        """expect(value) on a matching value applies the batch (compare-and-set)."""
        await store.put("KV", b"k", b"\x00v1\xff")
        await store.write(
            WriteBatch()
            .put("KV", b"k", b"v2")
            .delete("KV", b"gone")
            .expect("KV", b"k", b"\x00v1\xff")
        )
        assert await store.get("KV", b"k") == b"v2"

    async def test_condition_on_value_fails_on_mismatch_or_absence(self, store: Store) -> None:
        """expect(value) fails if the value differs or the key is missing; nothing applied."""
        await store.put("KV", b"k", b"actual")
        with pytest.raises(StoreConflict):
            await store.write(WriteBatch().put("KV", b"x", b"1").expect("KV", b"k", b"other"))
        with pytest.raises(StoreConflict):
            await store.write(WriteBatch().put("KV", b"x", b"1").expect("KV", b"nope", b""))
        assert await store.get("KV", b"x") is None

    async def test_empty_value_is_distinct_from_absence(self, store: Store) -> None:
        """A key holding b'' is present: expect(None) fails, expect(b'') passes."""
        await store.put("KV", b"k", b"")
        assert await store.get("KV", b"k") == b""
        with pytest.raises(StoreConflict):
            await store.write(WriteBatch().put("KV", b"k", b"x").expect("KV", b"k", None))
        await store.write(WriteBatch().put("KV", b"k", b"x").expect("KV", b"k", b""))
        assert await store.get("KV", b"k") == b"x"

    async def test_one_failing_condition_among_many_blocks_the_batch(self, store: Store) -> None:
        """If any condition fails the whole batch (all tables) is discarded."""
        await store.put_many("KV", {b"a": b"1", b"b": b"2"})
        batch = (
            WriteBatch()
            .expect("KV", b"a", b"1")
            .expect("NODE", b"n", None)
            .expect("KV", b"b", b"wrong")
            .put("KV", b"a", b"changed")
            .delete("KV", b"b")
            .put("NODE", b"n", b"x")
        )
        with pytest.raises(StoreConflict) as info:
            await store.write(batch)
        assert info.value.key == b"b"
        assert await store.get_all("KV") == {b"a": b"1", b"b": b"2"}
        assert await store.get_all("NODE") == {}

    async def test_condition_only_batch_checks_without_writing(self, store: Store) -> None:
        """A batch with only conditions raises on mismatch and is a no-op on match."""
        await store.put("KV", b"k", b"v")
        await store.write(WriteBatch().expect("KV", b"k", b"v"))
        with pytest.raises(StoreConflict):
            await store.write(WriteBatch().expect("KV", b"k", b"w"))

    async def test_concurrent_creates_of_one_key_have_exactly_one_winner(
        self, store: Store
    ) -> None:
        """Eight writers expecting the key absent: one succeeds, seven get StoreConflict."""

        async def create(i: int) -> int:
            await store.write(
                WriteBatch().put("KV", b"lock", str(i).encode()).expect("KV", b"lock", None)
            )
            return i

        results = await asyncio.gather(*(create(i) for i in range(8)), return_exceptions=True)
        winners = [r for r in results if isinstance(r, int)]
        assert len(winners) == 1
        assert all(isinstance(r, StoreConflict) for r in results if not isinstance(r, int))
        assert await store.get("KV", b"lock") == str(winners[0]).encode()

    async def test_compare_and_set_loops_lose_no_update(self, store: Store) -> None:
        """Concurrent read-modify-CAS loops on one key add up exactly (no lost update)."""
        await store.put("KV", b"n", b"0")

        async def bump() -> None:
            while True:
                current = await store.get("KV", b"n")
                assert current is not None
                nxt = str(int(current) + 1).encode()
                try:
                    await store.write(WriteBatch().put("KV", b"n", nxt).expect("KV", b"n", current))
                    return
                except StoreConflict:
                    continue

        await asyncio.gather(*(bump() for _ in range(6)))
        assert await store.get("KV", b"n") == b"6"


class TestCounters:
    """Counters start at 0, only go up, and are atomic."""

    async def test_counter_starts_at_zero_and_increments(self, store: Store) -> None:
        """read_counter is 0 before use; increment returns the new value."""
        assert await store.read_counter("JobCounter") == 0
        assert await store.increment("JobCounter") == 1
        assert await store.increment("JobCounter", 5) == 6
        assert await store.read_counter("JobCounter") == 6
        assert await store.read_counter("Other") == 0

    async def test_increment_rejects_non_positive_steps(self, store: Store) -> None:
        """A counter never goes backwards: by < 1 is a ValueError."""
        with pytest.raises(ValueError):
            await store.increment("c", 0)
        with pytest.raises(ValueError):
            await store.increment("c", -1)

    async def test_concurrent_increments_return_distinct_values(self, store: Store) -> None:
        """Twenty concurrent increments hand out 1..20, each exactly once."""
        values = await asyncio.gather(*(store.increment("c") for _ in range(20)))
        assert sorted(values) == list(range(1, 21))


class TestNamespaces:
    """Namespaces sharing one backend never see each other's data."""

    async def test_namespaces_isolate_tables_and_counters(self, backend: Backend) -> None:
        """Writes in namespace A are invisible in namespace B."""
        a = await backend.open(backend.namespace + "a")
        b = await backend.open(backend.namespace + "b")
        await a.put("KV", b"k", b"a")
        await a.increment("c")
        assert await b.get("KV", b"k") is None
        assert await b.get_all("KV") == {}
        assert await b.scan_prefix("KV", b"") == {}
        assert await b.read_counter("c") == 0
        await b.write(WriteBatch().put("KV", b"k", b"b").expect("KV", b"k", None))
        assert await a.get("KV", b"k") == b"a"


class TestDurability:
    """What a durable backend acknowledged is there after close and reopen."""

    async def test_data_survives_close_and_reopen(self, durable_backend: Backend) -> None:
        """Tables read back identically from a new store instance."""
        first = await durable_backend.open()
        await first.put_many("NODE", {b"\x00n": b"1", b"\xffm": b"2"})
        await first.write(WriteBatch().put("KV", b"k", b"v").delete("NODE", b"\xffm"))
        await first.close()
        second = await durable_backend.open()
        assert await second.get_all("NODE") == {b"\x00n": b"1"}
        assert await second.get("KV", b"k") == b"v"

    async def test_counters_survive_close_and_reopen(self, durable_backend: Backend) -> None:
        """A reopened store continues counting where the old one stopped."""
        first = await durable_backend.open()
        for _ in range(3):
            await first.increment("JobCounter")
        await first.close()
        second = await durable_backend.open()
        assert await second.read_counter("JobCounter") == 3
        assert await second.increment("JobCounter") == 4

    async def test_open_and_close_are_idempotent(self, durable_backend: Backend) -> None:
        """open() twice and close() twice are harmless; a closed store refuses to work."""
        store = await durable_backend.open()
        await store.open()
        await store.put("KV", b"k", b"v")
        await store.close()
        await store.close()
        with pytest.raises(StoreUnavailable):
            await store.get("KV", b"k")


class TestOutages:
    """A backend outage is StoreUnavailable, applies nothing, and heals by itself."""

    async def test_writes_fail_unavailable_during_outage_and_succeed_after(
        self, outage_backend: Backend
    ) -> None:
        """Writes and increments raise StoreUnavailable while the backend is away and work
        again once it is back, on the same store object; nothing half-applied remains."""
        store = await outage_backend.open()
        await store.put("KV", b"before", b"1")
        await store.increment("c")
        outage_backend.break_()
        try:
            with pytest.raises(StoreUnavailable):
                await store.write(WriteBatch().put("KV", b"during", b"2").put("NODE", b"n", b"2"))
            with pytest.raises(StoreUnavailable):
                await store.increment("c")
        finally:
            outage_backend.repair()
        await store.put("KV", b"after", b"3")
        assert await store.get_all("KV") == {b"before": b"1", b"after": b"3"}
        assert await store.get_all("NODE") == {}
        assert await store.increment("c") == 2

    async def test_open_fails_unavailable_when_backend_is_away(
        self, outage_backend: Backend
    ) -> None:
        """Opening a store during an outage raises StoreUnavailable (not a driver error);
        SQLite's open() takes the write lock (schema check), so a held lock blocks it too."""
        outage_backend.break_()
        try:
            with pytest.raises(StoreUnavailable):
                await outage_backend.open()
        finally:
            outage_backend.repair()
        store = await outage_backend.open()
        await store.put("KV", b"k", b"v")

    async def test_outage_under_concurrent_load_gives_definite_or_resolvable_errors(
        self, outage_backend: Backend
    ) -> None:
        """Writers busy when the backend goes away see StoreUnavailable (then nothing landed)
        or StoreOutcomeUnknown (a write in flight), never a driver error or a hang; after
        recovery landed() resolves every unknown one truthfully and every acknowledged write
        is intact."""
        store = await outage_backend.open()
        acked: list[bytes] = []
        started = asyncio.Event()

        async def writer(worker: int) -> tuple[BaseException, bytes, WriteBatch] | None:
            for i in range(10_000):
                key = f"{worker}-{i}".encode()
                batch = WriteBatch().put("KV", key, key)
                try:
                    await store.write(batch)
                except Exception as err:
                    return err, key, batch
                acked.append(key)
                if len(acked) >= 20:
                    started.set()
            return None

        tasks = [asyncio.create_task(writer(w)) for w in range(4)]
        await started.wait()
        # SQLite: our busy writers would starve another process's lock request (SQLite's
        # busy handler is not fair), so take the outage while they queue on the store's
        # in-process write lock.
        write_lock = getattr(store, "_write_lock", None) or contextlib.AsyncExitStack()
        async with write_lock:
            outage_backend.break_()
        try:
            failures = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        finally:
            outage_backend.repair()
        stored = await store.get_all("KV")
        assert all(stored.get(key) == key for key in acked)
        for failure in failures:
            assert failure is not None
            err, key, batch = failure
            assert isinstance(err, StoreUnavailable | StoreOutcomeUnknown), err
            if isinstance(err, StoreUnavailable):
                assert key not in stored, "StoreUnavailable said nothing was written"
            else:
                assert await store.landed(batch.write_id) == (key in stored)
