"""ApplyLane: serialized mutations, ambiguous writes resolved before the next one."""

from __future__ import annotations

import asyncio

import pytest

from gcs.base.clock import FakeClock
from gcs.base.errors import Unavailable
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.store import WriteBatch
from gcs.store.errors import StoreOutcomeUnknown, StoreUnavailable
from gcs.store.memory import MemoryStore
from gcs.testing.stores import FaultyStore, UnsureStore, WriteFault, YieldingStore


class Sleeps(FakeClock):
    """An injected clock whose sleeps record the backoff and never wait."""

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)


POLICY = ResolvePolicy(attempts=3, first_backoff_s=0.05, max_backoff_s=0.08)


def put(key: bytes, value: bytes = b"v") -> WriteBatch:
    return WriteBatch().put("T", key, value)


def lane_on(store: object, sleeps: Sleeps | None = None) -> ApplyLane:
    return ApplyLane(store, "test", sleeps or Sleeps(), policy=POLICY)  # type: ignore[arg-type]


class TestSerialization:
    async def test_check_and_apply_are_not_interleaved(self) -> None:
        """Two read-check-write-apply mutations on a yielding store: the second sees the
        first's apply (without the lane both would read 0 and the counter would end at 1)."""
        store = YieldingStore(MemoryStore(), yields=3)
        lane = lane_on(store)
        state = {"n": 0}

        async def bump() -> None:
            async with lane:
                seen = state["n"]

                def apply() -> None:
                    state["n"] = seen + 1

                await lane.commit(put(b"n", str(seen + 1).encode()), apply)

        await asyncio.gather(*(bump() for _ in range(5)))
        assert state["n"] == 5
        assert await store.get("T", b"n") == b"5"

    async def test_entering_twice_from_one_task_raises_instead_of_deadlocking(self) -> None:
        lane = lane_on(MemoryStore())
        async with lane:
            with pytest.raises(RuntimeError, match="entered twice"):
                async with lane:
                    pass
        async with lane:  # still usable
            pass

    async def test_commit_outside_the_lane_raises(self) -> None:
        lane = lane_on(MemoryStore())
        with pytest.raises(RuntimeError, match="outside the lane"):
            await lane.commit(put(b"k"), lambda: None)

    async def test_empty_batch_only_applies(self) -> None:
        store = MemoryStore()
        lane = lane_on(store)
        async with lane:
            assert await lane.commit(WriteBatch(), lambda: 7) == 7
        assert store.writes == 0


class TestAmbiguousWrites:
    async def test_landed_write_is_applied_at_once_and_succeeds(self) -> None:
        """Write landed, caller told 'unknown': the lane asks, learns it landed, applies."""
        store = FaultyStore(MemoryStore())
        lane = lane_on(store)
        applied: list[str] = []
        store.fail_next(WriteFault.AFTER)
        async with lane:
            await lane.commit(put(b"k"), lambda: applied.append("k"))
        assert applied == ["k"] and not lane.unresolved
        assert lane.ambiguous == 1 and lane.resolved_landed == 1

    async def test_certain_failure_applies_nothing(self) -> None:
        store = FaultyStore(MemoryStore())
        lane = lane_on(store)
        applied: list[str] = []
        store.fail_next(WriteFault.BEFORE)
        with pytest.raises(StoreUnavailable):
            async with lane:
                await lane.commit(put(b"k"), lambda: applied.append("k"))
        assert applied == [] and not lane.unresolved

    async def test_unresolved_write_is_applied_before_the_next_mutation(self) -> None:
        """The store cannot tell for a while: the caller gets StoreOutcomeUnknown, memory is
        untouched; the next mutation first learns the write landed and applies it, then runs
        (so memory matches the store again, in the original order)."""
        sleeps = Sleeps()
        store = UnsureStore(MemoryStore())
        lane = lane_on(store, sleeps)
        applied: list[str] = []
        store.fail_next(WriteFault.AFTER)
        store.unsure = POLICY.attempts
        with pytest.raises(StoreOutcomeUnknown):
            async with lane:
                await lane.commit(put(b"a"), lambda: applied.append("a"))
        assert applied == [] and lane.unresolved
        assert await store.get("T", b"a") == b"v"  # it did land
        assert sleeps.delays == [0.05, 0.08]  # backoff doubles, capped
        async with lane:
            assert applied == ["a"]
            await lane.commit(put(b"b"), lambda: applied.append("b"))
        assert applied == ["a", "b"] and not lane.unresolved

    async def test_backoff_sleeps_on_the_managers_clock(self) -> None:
        """The lane takes the manager's clock (no wall-clock default): resolving an
        ambiguous write waits until the FakeClock moves past each backoff."""
        clock = FakeClock()
        store = UnsureStore(MemoryStore())
        lane = ApplyLane(store, "test", clock, policy=POLICY)  # type: ignore[arg-type]
        store.fail_next(WriteFault.AFTER)
        store.unsure = 1  # the first question is unanswered, the second says "landed"
        applied: list[str] = []

        async def mutate() -> None:
            async with lane:
                await lane.commit(put(b"a"), lambda: applied.append("a"))

        task = asyncio.ensure_future(mutate())
        await clock.advance_until(lambda: clock.sleepers == 1, step_s=0.0)
        assert clock.next_wake_s == pytest.approx(POLICY.first_backoff_s) and applied == []
        clock.advance(POLICY.first_backoff_s)
        await task
        assert applied == ["a"] and lane.resolved_landed == 1

    async def test_lost_write_is_dropped_before_the_next_mutation(self) -> None:
        """An ambiguous write that in the end did not land is never applied."""
        store = UnsureStore(MemoryStore())
        lane = lane_on(store)
        applied: list[str] = []

        async def write_then_unknown(batch: WriteBatch) -> None:
            raise StoreOutcomeUnknown(batch.write_id, "timed out before sending")

        store.unsure = POLICY.attempts
        original = store.write
        store.write = write_then_unknown  # type: ignore[method-assign]
        with pytest.raises(StoreOutcomeUnknown):
            async with lane:
                await lane.commit(put(b"a"), lambda: applied.append("a"))
        store.write = original  # type: ignore[method-assign]
        async with lane:
            await lane.commit(put(b"b"), lambda: applied.append("b"))
        assert applied == ["b"] and lane.resolved_lost == 1

    async def test_still_unresolved_refuses_the_next_mutation_without_writing(self) -> None:
        store = UnsureStore(MemoryStore())
        lane = lane_on(store)
        store.fail_next(WriteFault.AFTER)
        store.unsure = 2 * POLICY.attempts
        with pytest.raises(StoreOutcomeUnknown):
            async with lane:
                await lane.commit(put(b"a"), lambda: None)
        writes = store.writes_seen
        with pytest.raises(Unavailable, match="still unknown"):
            async with lane:
                await lane.commit(put(b"b"), lambda: None)
        assert store.writes_seen == writes and lane.unresolved
        assert not lane.busy  # released after the refusal


class TestCancellation:
    async def test_cancelled_caller_still_finishes_the_mutation(self) -> None:
        """An RPC cancelled mid-write must not leave the write landed but unapplied: the
        lane finishes the write and the apply before it lets the next mutation in."""
        store = FaultyStore(MemoryStore())
        lane = lane_on(store)
        applied: list[str] = []
        store.fail_next(WriteFault.STALL)

        async def mutate(key: bytes) -> None:
            async with lane:
                await lane.commit(put(key), lambda: applied.append(key.decode()))

        first = asyncio.ensure_future(mutate(b"a"))
        for _ in range(100):  # let it reach the stalled write
            if store.stalled:
                break
            await asyncio.sleep(0)
        assert store.stalled == 1
        second = asyncio.ensure_future(mutate(b"b"))
        first.cancel()
        await asyncio.sleep(0)
        assert lane.busy and applied == []
        store.release()
        await second
        with pytest.raises(asyncio.CancelledError):
            await first
        assert applied == ["a", "b"]
        assert await store.get("T", b"a") == b"v"
