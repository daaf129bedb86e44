"""Work a manager starts from its synchronous event listeners (node, job, worker events
are told from another manager's apply step and may not await): each piece runs as a task
of its own that takes the manager's lane; a failure is logged, never lost silently."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

log = structlog.get_logger("gcs.managers")


class Background:
    def __init__(self, failure_event: str) -> None:
        self._failure_event = failure_event
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous test of another manager)
            work.close()
            return
        task = loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(self._failure_event, error=repr(task.exception()))

    async def settle(self) -> None:
        """Until every task spawned so far has finished (tests, shutdown)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    def cancel(self) -> list[asyncio.Task[Any]]:
        """Cancel every task; returns them (await them with the caller's other work)."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        return tasks
