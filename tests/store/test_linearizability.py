"""The linearizability checker: it accepts what a sequential KV could have produced, with
unknown outcomes, and rejects stale reads, two put-if-absent winners and lost writes."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gcs.managers.kv import KvManager
from gcs.store import StoreUnavailable
from gcs.store.memory import MemoryStore
from gcs.testing.linearizability import (
    History,
    Kind,
    Operation,
    Workload,
    check,
    inject_lost_write,
    inject_second_winner,
    inject_stale_read,
)
from gcs.testing.stores import UnsureStore, WriteFault, YieldingStore

K = b"k"


def put(client: int, call: int, ret: int | None, value: bytes, added: bool | None) -> Operation:
    return Operation(client, K, Kind.PUT, call, ret, added, value, overwrite=True)


def put_if_absent(
    client: int, call: int, ret: int | None, value: bytes, added: bool | None
) -> Operation:
    return Operation(client, K, Kind.PUT, call, ret, added, value, overwrite=False)


def get(client: int, call: int, ret: int | None, value: bytes | None) -> Operation:
    return Operation(client, K, Kind.GET, call, ret, value)


def delete(client: int, call: int, ret: int | None, deleted: int | None) -> Operation:
    return Operation(client, K, Kind.DELETE, call, ret, deleted)


class TestHandWrittenHistories:
    """Small histories whose verdict is known."""

    def test_sequential_history_of_every_kind_is_linearizable(self) -> None:
        """put, put-if-absent (loses), get, delete, get, put-if-absent (wins) in order."""
        ops = [
            put(0, 0, 1, b"a", True),
            put_if_absent(0, 2, 3, b"b", False),
            get(0, 4, 5, b"a"),
            delete(0, 6, 7, 1),
            delete(0, 8, 9, 0),
            get(0, 10, 11, None),
            put_if_absent(0, 12, 13, b"c", True),
        ]
        assert check(ops).ok

    def test_a_read_concurrent_with_a_write_may_see_either_value(self) -> None:
        """Reads overlapping put(b) see a or b, but once one saw b a later one cannot see a."""
        base, overwrite = put(0, 0, 1, b"a", True), put(1, 2, 7, b"b", False)
        assert check([base, overwrite, get(2, 3, 4, b"a"), get(3, 5, 6, b"b")]).ok
        assert check([base, overwrite, get(2, 3, 4, b"b"), get(3, 5, 6, b"b")]).ok
        assert check([base, overwrite, get(2, 3, 4, b"a"), get(3, 5, 6, b"a")]).ok
        assert not check([base, overwrite, get(2, 3, 4, b"b"), get(3, 5, 6, b"a")]).ok

    def test_a_stale_read_after_a_completed_overwrite_is_found(self) -> None:
        """put(a); put(b) returns; a later get returns a: not linearizable."""
        ops = [put(0, 0, 1, b"a", True), put(1, 2, 3, b"b", False), get(2, 4, 5, b"a")]
        result = check(ops)
        assert not result.ok
        assert result.violations[0].key == K
        assert "get() -> b'a'" in str(result)

    def test_two_put_if_absent_winners_without_a_delete_are_found(self) -> None:
        """Two concurrent create-if-absent calls both told added=True."""
        ops = [put_if_absent(0, 0, 3, b"a", True), put_if_absent(1, 1, 2, b"b", True)]
        assert not check(ops).ok

    def test_two_winners_with_a_delete_between_them_are_fine(self) -> None:
        """Create, delete, create again: two winners, each legitimately."""
        ops = [
            put_if_absent(0, 0, 1, b"a", True),
            delete(1, 2, 3, 1),
            put_if_absent(2, 4, 5, b"b", True),
        ]
        assert check(ops).ok

    def test_a_lost_write_is_found(self) -> None:
        """An acknowledged put, then a read that finds nothing (no delete anywhere)."""
        assert not check([put(0, 0, 1, b"a", True), get(1, 2, 3, None)]).ok

    def test_two_deletes_of_one_key_cannot_both_remove_it(self) -> None:
        """deleted_num is exact: one put, two deletes reporting 1 each."""
        ops = [put(0, 0, 1, b"a", True), delete(1, 2, 5, 1), delete(2, 3, 4, 1)]
        assert not check(ops).ok

    def test_an_unknown_write_may_take_effect(self) -> None:
        """A put with no answer, then a read that sees its value."""
        assert check([put(0, 0, None, b"a", None), get(1, 5, 6, b"a")]).ok

    def test_an_unknown_write_may_not_take_effect(self) -> None:
        """A put with no answer, then reads that never see it."""
        assert check([put(0, 0, None, b"a", None), get(1, 5, 6, None), get(1, 7, 8, None)]).ok

    def test_an_unknown_write_may_take_effect_long_after_its_call(self) -> None:
        """Not seen at first, seen later: it landed between the two reads."""
        ops = [put(0, 0, None, b"a", None), get(1, 1, 2, None), get(1, 9, 10, b"a")]
        assert check(ops).ok

    def test_an_unknown_write_cannot_take_effect_before_its_call(self) -> None:
        """A read that saw a value before the put that writes it was even invoked."""
        assert not check([get(1, 0, 1, b"a"), put(0, 2, None, b"a", None)]).ok

    def test_an_unknown_write_cannot_be_undone(self) -> None:
        """Seen, then gone without a delete: unknown does not mean reversible."""
        ops = [put(0, 0, None, b"a", None), get(1, 1, 2, b"a"), get(1, 3, 4, None)]
        assert not check(ops).ok

    def test_keys_are_checked_independently(self) -> None:
        """A violation names its key; a valid key next to it is not reported."""
        good = Operation(0, b"good", Kind.PUT, 0, 1, True, b"x")
        bad = [put(0, 0, 1, b"a", True), get(1, 2, 3, None)]
        result = check([good, *bad])
        assert [v.key for v in result.violations] == [K]
        assert result.keys == 2 and result.operations == 3


class TestRecording:
    """History.run records results, unknown outcomes and definite failures."""

    async def test_errors_are_unknown_unless_marked_as_definite_failures(self) -> None:
        """An error is re-raised; it leaves the operation unknown, or out when definite."""
        history = History()

        async def boom(err: Exception) -> None:
            raise err

        for err in (TimeoutError("lost"), StoreUnavailable("down")):
            with pytest.raises(type(err)):
                await history.run(
                    0, K, Kind.GET, boom(err), failed_if=lambda e: isinstance(e, StoreUnavailable)
                )
        assert [op.unknown for op in history.operations] == [True]
        assert history.failed == 1

    async def test_results_and_logical_times_are_recorded(self) -> None:
        """A completed operation has its client, result and call before return."""
        history = History()

        async def value() -> bytes:
            return b"v"

        assert await history.run(3, K, Kind.GET, value()) == b"v"
        (op,) = history.operations
        assert (op.client, op.result, op.call < (op.ret or 0)) == (3, b"v", True)


async def _recorded_history(seed: int) -> list[Operation]:
    """Concurrent InternalKV clients over a store that interleaves every call and fails
    some writes before (nothing written) or after (written, caller told "unknown")."""
    unsure = UnsureStore(YieldingStore(MemoryStore(), yields=3))
    kv = KvManager(unsure)
    history = History()
    calls = 0

    def stop() -> bool:
        nonlocal calls
        calls += 1
        if calls % 17 == 0:
            unsure.fail_next(WriteFault.AFTER if calls % 2 else WriteFault.BEFORE)
            unsure.unsure = 1  # landed() cannot tell once: the AFTER stays unknown
        return calls > 600

    workload = Workload(clients=6, keys=4, delete_keys=1, seed=seed)
    await workload.run(kv, history, stop=stop, failed_if=lambda e: isinstance(e, StoreUnavailable))
    await workload.read_back(kv, history)
    return history.operations


class TestRecordedHistories:
    """A real history (KvManager over a faulty, interleaving store) passes; each injected
    fault makes it fail."""

    async def test_recorded_history_with_unknown_outcomes_is_linearizable(self) -> None:
        """Six clients, injected failures and unknown outcomes: the check passes."""
        ops = await _recorded_history(seed=1)
        assert any(op.unknown for op in ops)
        assert len({op.client for op in ops}) > 2
        result = check(ops)
        assert result.ok, str(result)

    async def test_each_injected_fault_is_found(self) -> None:
        """Stale read, second put-if-absent winner, lost write: each makes it fail."""
        ops = await _recorded_history(seed=2)
        assert check(ops).ok
        for inject in (inject_stale_read, inject_second_winner, inject_lost_write):
            faulty = inject(ops)
            assert not check(faulty).ok, inject.__name__


# -- histories generated from the sequential model --------------------------------------------


@dataclass
class _Pending:
    client: int
    key: bytes
    kind: Kind
    call: int
    value: bytes | None = None
    overwrite: bool = True
    applied: bool = False
    result: object = None


@dataclass
class _Simulation:
    """Clients running against one sequential KV; each operation takes effect at one step
    between its call and its return (or, when its outcome is lost, maybe never)."""

    state: dict[bytes, bytes] = field(default_factory=dict)
    tick: int = 0
    pending: dict[int, _Pending] = field(default_factory=dict)
    orphans: list[_Pending] = field(default_factory=list)
    ops: list[Operation] = field(default_factory=list)
    writes: int = 0

    def now(self) -> int:
        self.tick += 1
        return self.tick

    def apply(self, p: _Pending) -> None:
        current = self.state.get(p.key)
        if p.kind is Kind.GET:
            p.result = current
        elif p.kind is Kind.PUT:
            p.result = current is None
            if p.overwrite or current is None:
                assert p.value is not None
                self.state[p.key] = p.value
        else:
            p.result = 0 if current is None else 1
            self.state.pop(p.key, None)
        p.applied = True

    def record(self, p: _Pending, ret: int | None) -> None:
        result = p.result if ret is not None else None
        self.ops.append(
            Operation(p.client, p.key, p.kind, p.call, ret, result, p.value, p.overwrite)
        )


@st.composite
def model_histories(draw: st.DrawFn) -> list[Operation]:
    clients = draw(st.integers(1, 5))
    keys = [f"k{i}".encode() for i in range(draw(st.integers(1, 3)))]
    sim = _Simulation()
    for _ in range(draw(st.integers(0, 50))):
        client = draw(st.integers(0, clients - 1))
        action = draw(st.sampled_from(["step", "step", "step", "lose", "fail", "orphan"]))
        p = sim.pending.get(client)
        if action == "orphan":
            if sim.orphans:
                sim.apply(sim.orphans.pop(draw(st.integers(0, len(sim.orphans) - 1))))
        elif p is None:
            kind = draw(st.sampled_from(list(Kind)))
            sim.writes += 1
            sim.pending[client] = _Pending(
                client,
                draw(st.sampled_from(keys)),
                kind,
                sim.now(),
                value=f"{client}-{sim.writes}".encode() if kind is Kind.PUT else None,
                overwrite=draw(st.booleans()),
            )
        elif action == "step":
            if p.applied:
                sim.record(p, sim.now())
                del sim.pending[client]
            else:
                sim.apply(p)
        elif action == "lose":  # "may have been applied": applied already, later, or never
            sim.record(p, None)
            if not p.applied and draw(st.booleans()):
                sim.orphans.append(p)
            del sim.pending[client]
        elif not p.applied:  # "fail": definitely not applied, left out of the history
            del sim.pending[client]
    for p in sim.pending.values():
        if not p.applied:
            sim.apply(p)
        sim.record(p, sim.now())
    return sim.ops


class TestGeneratedHistories:
    @settings(deadline=None)
    @given(model_histories())
    def test_every_history_a_sequential_kv_produces_is_linearizable(
        self, ops: list[Operation]
    ) -> None:
        """Whatever the interleaving, unknown outcomes and failures: accepted."""
        result = check(ops)
        assert result.ok, str(result)


async def test_until_completed_wakes_on_the_answer_that_reaches_the_count() -> None:
    """Tests wait for a workload's progress as a count of answered operations; failed and
    unknown operations do not count."""
    history = History()
    gate = asyncio.Event()

    async def answer() -> bytes:
        return b"v"

    async def answer_at_the_gate() -> bytes:
        await gate.wait()
        return b"v"

    async def refuse() -> bytes:
        raise RuntimeError("unknown outcome")

    waiter = asyncio.create_task(history.until_completed(2))
    first = asyncio.create_task(history.run(0, b"k", Kind.GET, answer_at_the_gate()))
    gate.set()
    await first  # the waiter ran before it (tasks start in order) and is waiting
    with contextlib.suppress(RuntimeError):
        await history.run(0, b"k", Kind.GET, refuse())
    assert not waiter.done() and history.completed == 1
    await history.run(1, b"k", Kind.GET, answer())
    await asyncio.wait_for(waiter, 5)
    await history.until_completed(1)  # already reached: returns at once
