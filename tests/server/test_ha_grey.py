"""Grey failures of the HA lease loop (issue 29 items 1-5) on the fake clock: members whose
store link is slow one way, slow both ways, or a blackhole (gcs.testing.ha_link), and a
paused same-host ex-leader.  The outage bounds are the issue's: TTL + 0.5 s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from gcs.base.clock import FakeClock
from gcs.server.ha import HaCoordinator
from gcs.store.base import TABLE_NODE, WriteBatch
from gcs.store.errors import StoreOutcomeUnknown
from gcs.store.memory import MemoryStore
from gcs.testing.ha_link import LinkStore
from tests.server.test_ha_coordinator import RENEW_MS, TTL_MS, FakeLocks, Member

TTL_S = TTL_MS / 1000
STEP_S = 0.01


@pytest.fixture
async def group() -> AsyncIterator[Callable[..., Member]]:
    members: list[Member] = []

    def make(name: str, store: MemoryStore, clock: FakeClock, **kw: object) -> Member:
        member = Member(name, store, clock, **kw)  # type: ignore[arg-type]
        members.append(member)
        return member

    yield make
    for member in members:
        if isinstance(member.store, LinkStore):
            member.store.blackhole = False  # a stop's lease release must get through
            member.store.request_s = member.store.reply_s = 0.0  # (nobody moves the clock)
        if member.task is not None:
            member.task.cancel()
            await asyncio.gather(member.task, return_exceptions=True)


def _lease_end(shared: MemoryStore) -> float:
    lease = shared._shared.lease
    assert lease is not None
    return lease.expires_s


class Watch:
    """Who admits calls, sampled every step: the last answer of one member and the first of
    another (the outage), and whether two ever admitted at once."""

    def __init__(self, clock: FakeClock, *members: Member) -> None:
        self.clock = clock
        self.members = members
        self.last: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.both = False

    def sample(self) -> None:
        now = self.clock.monotonic_s()
        admitting = [m for m in self.members if m.terms and m.coordinator.admit()]
        self.both |= len(admitting) > 1
        for m in admitting:
            self.last[m.name] = now
            self.first.setdefault(m.name, now)

    async def until(self, predicate: Callable[[], bool], limit_s: float) -> None:
        end = self.clock.monotonic_s() + limit_s
        while not predicate():
            assert self.clock.monotonic_s() < end, "not within the bound"
            await self.clock.run_for(STEP_S, STEP_S)
            self.sample()


async def test_an_acquired_lease_is_trusted_from_when_the_request_was_sent(
    group: Callable[..., Member],
) -> None:
    """Item 1: the store granted the lease at once, the reply came 1.5 s later (a stalled
    loop, a delayed packet), and no renewal gets through after that: the leader must stop
    answering before the store's lease ends, not 1.8 s after the reply."""
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    link = LinkStore.over(shared, clock)

    def after(name: str) -> None:
        if name == "acquire":
            link.reply_s = 1.5  # this reply is late, and the link breaks behind it
            link.after = lambda _: setattr(link, "fail_writes", True)

    link.after = after
    a = group("a", link, clock).start()
    start = clock.monotonic_s()
    while clock.monotonic_s() < start + 3 * TTL_S:
        await clock.run_for(STEP_S, STEP_S)
        if a.terms and a.term.admit():
            end = _lease_end(shared)
            assert clock.monotonic_s() < end, (
                f"answering {clock.monotonic_s() - end:.2f} s after the store's lease ended"
            )
    assert a.terms, "it did lead"


async def test_a_leader_cut_from_its_store_answers_its_pending_calls_by_its_lease_end(
    group: Callable[..., Member],
) -> None:
    """Item 2: writes admitted before a blackhole are answered ("may have been applied")
    and the term is closed by the time the lease could have ended in the store, not a TTL
    later, and not left to the clients' deadlines."""
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    link = LinkStore.over(shared, clock)
    a = group("a", link, clock).start()
    await clock.advance_until(lambda: a.coordinator.serving, STEP_S)
    await clock.run_for(1.0, STEP_S)
    link.blackhole = True
    end = _lease_end(shared)
    pending = [
        asyncio.ensure_future(a.term.store.write(WriteBatch().put(TABLE_NODE, b"n%d" % n, b"v")))
        for n in range(3)
    ]
    await clock.advance_until(lambda: all(p.done() for p in pending) and a.term.stopped, STEP_S)
    assert clock.monotonic_s() <= end, f"{clock.monotonic_s() - end:.2f} s past the lease"
    for call in pending:
        with pytest.raises(StoreOutcomeUnknown, match="may have been applied"):
            call.result()
    assert a.coordinator.stranded == 3
    link.blackhole = False


async def test_a_late_renewal_does_not_keep_a_leader_that_already_refuses(
    group: Callable[..., Member],
) -> None:
    """Item 3: 1.5 s one-way latency on the leader's link (both directions tried): its
    renewals still reach the store, but each is confirmed after its trust ended.  The
    leader steps down instead of flapping, and the healthy standby serves within the TTL
    + 0.5 s of the leader's last answer."""
    for direction in ("request_s", "reply_s"):
        clock = FakeClock()
        shared = MemoryStore(clock=clock)
        link = LinkStore.over(shared, clock)
        a = group("a", link, clock).start()
        await clock.advance_until(lambda: a.coordinator.serving, STEP_S)  # noqa: B023
        b = group("b", shared.handle(), clock).start()
        await b.coordinator.warm()
        await clock.run_for(1.0, STEP_S)
        watch = Watch(clock, a, b)
        setattr(link, direction, 1.5)
        await watch.until(lambda: b.coordinator.serving, 3 * TTL_S)  # noqa: B023
        outage = watch.first["b"] - watch.last["a"]
        assert outage <= TTL_S + 0.5, f"{direction}: outage {outage:.2f} s"
        await clock.run_for(2 * TTL_S, STEP_S)
        watch.sample()
        assert not watch.both
        assert b.leader and not a.leader and watch.last["a"] < watch.first["b"]


async def test_a_standby_with_a_slow_link_leaves_the_lease_to_a_healthy_one(
    group: Callable[..., Member],
) -> None:
    """Item 4: standby b's link answers 0.6 s late (its round trip is over a quarter of the
    TTL); standby c is healthy but cannot reach the store for 1.8 s after the leader's
    release, so b's attempts come first.  b must not take a lease it can barely keep:
    c serves within TTL + 0.5 s of the release, and b never starts a term."""
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    a = group("a", shared.handle(), clock).start()
    await clock.advance_until(lambda: a.coordinator.serving, STEP_S)
    slow = LinkStore.over(shared, clock)
    slow.reply_s = 0.6
    b = group("b", slow, clock).start()
    c_store = shared.handle()
    c = group("c", c_store, clock).start()
    await clock.advance_until(b.coordinator._warm.is_set, STEP_S)
    await c.coordinator.warm()
    await clock.run_for(3.0, STEP_S)
    c_store.fail_writes = True
    assert a.task is not None
    a.task.cancel()  # a clean stop: the lease is released now
    await asyncio.gather(a.task, return_exceptions=True)
    released = clock.monotonic_s()
    await clock.run_for(1.8, STEP_S)
    c_store.fail_writes = False
    await clock.advance_until(lambda: c.coordinator.serving or bool(b.terms), STEP_S)
    assert not b.terms, "the slow standby took the lease"
    assert clock.monotonic_s() - released <= TTL_S + 0.5
    await clock.run_for(2 * TTL_S, STEP_S)
    assert c.leader and not b.terms


async def test_a_slow_standby_still_takes_a_lease_nobody_healthy_takes(
    group: Callable[..., Member],
) -> None:
    """The gate of item 4 is not a veto: alone, a slow standby takes over once the lease
    stayed free for a TTL."""
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    a = group("a", shared.handle(), clock).start()
    await clock.advance_until(lambda: a.coordinator.serving, STEP_S)
    slow = LinkStore.over(shared, clock)
    slow.reply_s = 0.6
    b = group("b", slow, clock).start()
    await clock.advance_until(b.coordinator._warm.is_set, STEP_S)
    assert a.task is not None
    a.task.cancel()
    await asyncio.gather(a.task, return_exceptions=True)
    await clock.advance_until(lambda: b.coordinator.serving, STEP_S, timeout_s=30)


@pytest.mark.parametrize("stalled", [True, False])
async def test_the_new_leader_ends_a_stalled_same_host_ex_leader_only(
    group: Callable[..., Member], stalled: bool
) -> None:
    """Item 5: a leader paused (its record still says it leads the superseded epoch) is
    ended by the member that took its lease; a leader that stepped down (its record says
    standby) is left alone."""
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    host = FakeLocks()
    link = LinkStore.over(shared, clock)
    a = group("a", link, clock, locks=host.on_same_host()).start()
    await clock.advance_until(lambda: a.coordinator.serving, STEP_S)
    b = group("b", shared.handle(), clock, locks=host.on_same_host()).start()
    await b.coordinator.warm()
    await clock.run_for(1.0, STEP_S)
    if stalled:  # a runs nothing from now on: its record is not rewritten
        coordinator: HaCoordinator = a.coordinator
        coordinator._mark = lambda role, epoch: None  # type: ignore[method-assign]
    link.blackhole = True
    await clock.advance_until(lambda: b.coordinator.serving, STEP_S)
    await clock.run_for(0.1, STEP_S)
    assert host.ended == (["a"] if stalled else [])
    assert b.coordinator.ended_stalled == int(stalled)
    link.blackhole = False


def test_the_bounds_are_the_issues() -> None:
    assert (TTL_MS, RENEW_MS) == (2000, 500)  # the default lease the issue measures on
