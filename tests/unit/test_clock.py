"""FakeClock: sleepers wake only when the test moves time past theirs, in time order; the
helpers tests drive loops with (run_for, advance_until); wait_event on either clock."""

from __future__ import annotations

import asyncio

import pytest

from gcs.base.clock import FakeClock, SystemClock, wait_event, within


async def test_a_sleeper_wakes_only_once_time_has_passed() -> None:
    clock = FakeClock()
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("late", 2.0), ("early", 1.0))]
    await asyncio.sleep(0)  # both are asleep now
    assert clock.sleepers == 2
    clock.advance(0.999)
    await asyncio.sleep(0)
    assert woke == [] and clock.sleepers == 2
    clock.advance(5)
    await asyncio.gather(*tasks)
    assert woke == ["early", "late"] and clock.sleepers == 0


async def test_a_cancelled_sleeper_does_not_break_advance() -> None:
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep(1))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert clock.sleepers == 0
    clock.advance(2)  # the cancelled entry is skipped
    await clock.sleep(0)  # no time: returns at once


async def test_the_system_clock_sleeps_in_real_time() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await SystemClock().sleep(0.01)
    assert loop.time() - started >= 0.01


async def test_one_advance_wakes_a_periodic_loop_once_run_for_wakes_it_every_period() -> None:
    """A loop that sleeps a period at a time: one big ``advance`` runs it once (each sleeper
    wakes at most once), ``run_for`` in period steps runs it once per period."""
    clock = FakeClock()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            await clock.sleep(1.0)
            rounds += 1

    task = asyncio.create_task(loop())
    try:
        await asyncio.sleep(0)
        clock.advance(5.0)
        for _ in range(3):
            await asyncio.sleep(0)
        assert rounds == 1
        await clock.run_for(5.0, step_s=1.0)
        assert rounds == 6
    finally:
        task.cancel()


async def test_advance_until_moves_time_only_until_the_condition_holds() -> None:
    clock = FakeClock()
    done = asyncio.Event()

    async def later() -> None:
        await clock.sleep(3.0)
        done.set()

    task = asyncio.create_task(later())
    await asyncio.sleep(0)  # asleep now
    start = clock.monotonic_s()
    await clock.advance_until(done.is_set, step_s=0.5)
    assert 3.0 <= clock.monotonic_s() - start < 3.5
    await task

    async def already() -> bool:
        return True

    before = clock.monotonic_s()
    await clock.advance_until(already, step_s=1.0)  # async predicates too; holds: no step
    assert clock.monotonic_s() == before


async def test_advance_until_fails_when_the_condition_never_holds() -> None:
    clock = FakeClock()
    with pytest.raises(AssertionError, match="not met"):
        await clock.advance_until(lambda: False, step_s=1.0, timeout_s=0.05)


async def test_next_wake_is_the_earliest_live_sleeper() -> None:
    clock = FakeClock()
    assert clock.next_wake_s is None
    early = asyncio.create_task(clock.sleep(1.0))
    late = asyncio.create_task(clock.sleep(2.5))
    await asyncio.sleep(0)
    assert clock.next_wake_s == 1.0
    early.cancel()
    await asyncio.gather(early, return_exceptions=True)
    assert clock.next_wake_s == 2.5  # the cancelled one is skipped
    clock.advance(2.5)
    await late
    assert clock.next_wake_s is None


async def test_wait_event_returns_on_the_event_or_after_the_clocks_timeout() -> None:
    clock = FakeClock()
    event = asyncio.Event()
    waiter = asyncio.create_task(wait_event(clock, event, 10.0))
    await asyncio.sleep(0)
    event.set()
    assert await waiter is True
    assert clock.sleepers == 0  # its timer went with it
    event.clear()
    waiter = asyncio.create_task(wait_event(clock, event, 10.0))
    for _ in range(3):  # the waiter, then its timer, are asleep
        await asyncio.sleep(0)
    assert clock.sleepers == 1
    clock.advance(9.9)
    await asyncio.sleep(0)
    assert not waiter.done()
    clock.advance(0.1)
    assert await waiter is False


async def test_within_answers_in_time_or_times_out_on_the_clock_not_on_wall_time() -> None:
    """The one deadline helper: a result before the deadline is returned; once the
    FakeClock passes the deadline the work is cancelled and TimeoutError raised."""
    clock = FakeClock()

    async def answer(after_s: float) -> str:
        await clock.sleep(after_s)
        return "answer"

    quick = asyncio.create_task(within(clock, 5.0, answer(1.0)))
    await clock.advance_until(quick.done, step_s=0.5)
    assert quick.result() == "answer" and clock.sleepers == 0

    cancelled: list[bool] = []

    async def never() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    slow = asyncio.create_task(within(clock, 5.0, never()))
    await clock.advance_until(lambda: clock.sleepers == 1, step_s=0.0)  # its deadline is set
    await clock.run_for(4.9, step_s=0.7)
    assert not slow.done()  # no wall time counts, only the clock's
    await clock.run_for(0.2, step_s=0.2)
    with pytest.raises(TimeoutError, match="within 5 s"):
        await slow
    assert cancelled == [True] and clock.sleepers == 0


async def test_within_passes_the_works_own_errors_and_outside_cancellation() -> None:
    clock = FakeClock()

    async def fails() -> None:
        raise TimeoutError("the work's own")

    with pytest.raises(TimeoutError, match="the work's own"):
        await within(clock, 5.0, fails())
    waiter = asyncio.create_task(within(clock, 5.0, asyncio.Event().wait()))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert clock.sleepers == 0


async def test_call_later_runs_on_the_clock_and_is_cancellable() -> None:
    clock = FakeClock()
    fired: list[str] = []
    clock.call_later(2.0, lambda: fired.append("a"))
    dropped = clock.call_later(1.0, lambda: fired.append("b"))
    dropped.cancel()
    await clock.run_for(1.9, step_s=0.5)
    assert fired == []
    await clock.run_for(0.2, step_s=0.2)
    assert fired == ["a"]


async def test_system_clock_timeout_is_asyncio_timeout() -> None:
    with pytest.raises(TimeoutError):
        await within(SystemClock(), 0.01, asyncio.Event().wait())
