"""FakeClock.sleep: sleepers wake only when the test moves time past theirs, in time order."""

from __future__ import annotations

import asyncio

from gcs.clock import FakeClock, SystemClock


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
