"""Background tasks a component starts and owns, with one failure policy.

Work that cannot run inline -- a follow-up a synchronous event listener starts (node, job,
worker events are told from another manager's apply step and may not await), a raylet call
per node, a two-phase commit -- runs as a task spawned here.  The owner closes them all on
shutdown (:meth:`Background.close`) and tests wait for them (:meth:`Background.settle`).

The failure policy, the same everywhere: a task's exception is always retrieved, never left
to asyncio's "Task exception was never retrieved".  A domain error (:class:`~gcs.errors.
GcsError`, store errors included: the store or a raylet was unavailable) is a failure of the
work, expected in operation: a warning naming the task.  Anything else is a bug: an error
with its traceback.  A caller that must react to a failure (retry, give back) handles it in
the coroutine it spawns; this helper only guarantees that nothing fails unseen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

from gcs.errors import GcsError

__all__ = ["Background"]

log = structlog.get_logger("gcs.background")


class Background:
    def __init__(self, owner: str) -> None:
        """``owner`` names the component in every log line (``background.failed``)."""
        self.owner = owner
        self.tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self.tasks)

    def spawn(self, work: Coroutine[Any, Any, Any], name: str = "") -> asyncio.Task[Any] | None:
        """Run ``work`` as a task of this owner; None (and ``work`` closed) when no event
        loop runs (a synchronous test of another manager emitting events)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            work.close()
            return None
        task = loop.create_task(work, name=f"{self.owner}:{name}" if name else self.owner)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        err = task.exception()
        if err is None:
            return
        if isinstance(err, GcsError):
            log.warning("background.failed", task=task.get_name(), error=err.message)
        else:
            log.error("background.failed", task=task.get_name(), exc_info=err)

    async def settle(self) -> None:
        """Until every task spawned so far (and those they spawned) has finished."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    def cancel(self) -> list[asyncio.Task[Any]]:
        """Cancel every task; returns them (await them with the caller's other work)."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        return tasks

    async def close(self) -> None:
        """Cancel every task and wait until they have all ended."""
        while self.tasks:
            await asyncio.gather(*self.cancel(), return_exceptions=True)
