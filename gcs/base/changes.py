"""Wait for a condition on an object that changes, woken by the object, never by a timer.

An owner that others (tests, mostly) wait on calls :meth:`Changes.notify` after each change
of its state; a waiter calls ``await changes.until(predicate)``, which re-checks the
predicate after every notification.  A notification nobody waits for costs one attribute
test, so hot paths may notify freely.

Tests wait on these instead of polling with a wall-clock deadline: a condition that holds
returns at once, one that never does hangs until the test runner's timeout says which.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["Changes"]


class Changes:
    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self.count = 0
        """Notifications so far."""

    def notify(self) -> None:
        self.count += 1
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def until(self, predicate: Callable[[], object]) -> None:
        """Return once ``predicate()`` is truthy, checking now and after each change."""
        while not predicate():
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
