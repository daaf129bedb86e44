"""Injected time: managers read a :class:`Clock`, tests drive a :class:`FakeClock`.

Every background loop sleeps on its clock (:meth:`Clock.sleep`, :func:`wait_event`), never
on ``asyncio.sleep``, and every time limit is :func:`within` (never ``asyncio.wait_for`` or
``asyncio.timeout``, which measure wall time), so a test moves a health-check period, a retry
interval or a deadline by moving a :class:`FakeClock` (:meth:`FakeClock.advance`,
:meth:`FakeClock.advance_until`) and waits for what happens, not for wall time.
``tests/unit/test_one_way_to_run_work.py`` holds the GCS process's side to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import inspect
import itertools
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Protocol, TypeVar

T = TypeVar("T")
Predicate = Callable[[], "bool | Awaitable[bool]"]


class Timer(Protocol):
    def cancel(self) -> object: ...


class Deadline(Protocol):
    """An ``async with`` time limit (``asyncio.Timeout``'s shape): the body is cancelled and
    :class:`TimeoutError` raised once the time passed; :meth:`expired` tells it was so."""

    async def __aenter__(self) -> object: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None: ...

    def expired(self) -> bool: ...


class Clock(Protocol):
    def now_s(self) -> float:
        """Wall-clock seconds since the epoch (for timestamps on the wire)."""

    def monotonic_s(self) -> float:
        """Monotonic seconds (for durations and deadlines)."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` (synchronous, on the running loop) once ``seconds`` passed,
        unless the returned timer was cancelled (a transport's protocol timer)."""

    def timeout(self, seconds: float) -> Deadline:
        """A time limit of ``seconds`` on this clock (see :func:`within`)."""


class SystemClock:
    """Wall time: the only place the GCS process's side sleeps or times out on it."""

    def now_s(self) -> float:
        return time.time()

    def monotonic_s(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(seconds, callback)

    def timeout(self, seconds: float) -> Deadline:
        return asyncio.timeout(seconds)  # no task, no future: cheap on a hot path


SYSTEM_CLOCK = SystemClock()
"""The process's wall clock, for a transport built before a wiring hands it one."""


class FakeClock:
    """A clock that moves only when told to; its sleepers wake when :meth:`advance` passes
    their time (in the order of their times)."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._now = start_s
        self._mono = 1000.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_s(self) -> float:
        return self._now

    def monotonic_s(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), wake))
        await wake

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Timer:
        loop = asyncio.get_running_loop()
        if seconds <= 0:
            return loop.call_soon(callback)  # due now, as asyncio's call_later(0)
        wake: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), wake))
        wake.add_done_callback(lambda done: done.cancelled() or callback())
        return wake

    def timeout(self, seconds: float) -> Deadline:
        return _FakeDeadline(self, seconds)

    @property
    def sleepers(self) -> int:
        """Sleepers and timers (``call_later``, deadlines) still waiting (cancelled ones
        excluded)."""
        return sum(1 for _, _, wake in self._sleepers if not wake.done())

    @property
    def next_wake_s(self) -> float | None:
        """Seconds until the earliest sleeper is due (None: nobody sleeps)."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)  # cancelled sleepers
        return self._sleepers[0][0] - self._mono if self._sleepers else None

    def advance(self, seconds: float) -> None:
        """Move time; wake every sleeper due by then (they run once the caller yields)."""
        self._now += seconds
        self._mono += seconds
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, wake = heapq.heappop(self._sleepers)
            if not wake.done():
                wake.set_result(None)

    async def run_for(self, seconds: float, step_s: float) -> None:
        """Move ``seconds`` of time ``step_s`` at a time, letting the event loop run after
        each step: a loop woken by one step sleeps again and wakes at the next, as it would
        in real time (one :meth:`advance` wakes each sleeper at most once)."""
        if step_s <= 0:
            raise ValueError(f"step_s must be > 0, got {step_s}")
        left = seconds
        while left > 1e-12:
            step = min(step_s, left)
            self.advance(step)
            left -= step
            await _let_run()

    async def advance_until(
        self, predicate: Predicate, step_s: float, *, timeout_s: float = 30.0
    ) -> None:
        """Move time ``step_s`` at a time until ``predicate()`` (sync or async) holds.

        Between steps the event loop runs (woken sleepers, the I/O they start, replies from
        in-process servers).  ``timeout_s`` of wall time only bounds a hang: a condition
        that holds returns at once; one that never does raises AssertionError."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not await _holds(predicate):
            if loop.time() > deadline:
                raise AssertionError(f"condition not met within {timeout_s} s of wall time")
            self.advance(step_s)
            await _let_run()


class _FakeDeadline:
    """:meth:`FakeClock.timeout`: ``asyncio.timeout`` on the fake clock's time."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self._clock = clock
        self._seconds = seconds
        self._task: asyncio.Task[object] | None = None
        self._timer: Timer | None = None
        self._expired = False

    def expired(self) -> bool:
        return self._expired

    async def __aenter__(self) -> _FakeDeadline:
        self._task = asyncio.current_task()
        if self._task is None:
            raise RuntimeError("a deadline needs a task")
        self._timer = self._clock.call_later(self._seconds, self._expire)
        return self

    def _expire(self) -> None:
        if self._timer is None or self._task is None:
            return  # the body ended first
        self._expired = True
        self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        expired = self._expired and self._task is not None and self._task.uncancel() == 0
        if expired and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
        return None


async def _holds(predicate: Predicate) -> bool:
    result = predicate()
    if inspect.isawaitable(result):
        result = await result
    return bool(result)


async def _let_run() -> None:
    """Give the loop a few turns and one short poll of its sockets: tasks woken by a time
    step run, and replies already on their way (a local gRPC call) arrive."""
    for _ in range(3):
        await asyncio.sleep(0)
    await asyncio.sleep(0.002)


def now_ms(clock: Clock) -> int:
    return int(clock.now_s() * 1000)


async def within(clock: Clock, seconds: float, awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, or :class:`TimeoutError` once ``seconds`` have passed on
    ``clock`` (the awaitable is then cancelled).

    The one deadline helper: every time limit on the GCS process's side is measured on the
    injected clock (this, or :meth:`Clock.timeout` it is made of), never with
    ``asyncio.wait_for`` / ``asyncio.timeout`` on wall time, so a test moves it with a
    :class:`FakeClock`."""
    limit = clock.timeout(seconds)
    try:
        async with limit:
            return await awaitable
    except TimeoutError:
        if limit.expired():
            raise TimeoutError(f"no answer within {seconds:g} s") from None
        raise


async def wait_event(clock: Clock, event: asyncio.Event, timeout_s: float) -> bool:
    """Until ``event`` is set or ``timeout_s`` of ``clock``'s time passed; whether it is set.

    A loop that wakes on an event *or* a period (a scheduler's retry pass) waits here, so a
    test moves its period with a :class:`FakeClock` instead of waiting wall time."""
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        await within(clock, timeout_s, event.wait())
    return event.is_set()
