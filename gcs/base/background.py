"""Background tasks a component starts and owns, with one failure policy.

Work that cannot run inline -- a follow-up a synchronous event listener starts (node, job,
worker events are told from another manager's apply step and may not await), a raylet call
per node, a two-phase commit -- runs as a task spawned here.  The owner closes them all on
shutdown (:meth:`Background.close`) and tests wait for them (:meth:`Background.settle`).

The failure policy, the same everywhere: a task's exception is always retrieved, never left
to asyncio's "Task exception was never retrieved".  A domain error (:class:`~gcs.base.errors.
GcsError`, store errors included: the store or a raylet was unavailable) is a failure of the
work, expected in operation: a warning naming the task.  Anything else is a bug: an error
with its traceback.  A caller that must react to a failure (retry, give back) handles it in
the coroutine it spawns; this helper only guarantees that nothing fails unseen.

Two awaiting forms for work the caller waits on itself: :func:`race` (the first of several
to end; the rest cancelled) and :func:`shielded` (finished even if the caller is cancelled).
With ``gcs.base.lifecycle`` (the supervisor, ``start_until_ready``) these are the only places on
the GCS process's side that start a task (``tests/unit/test_one_way_to_run_work.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

import structlog

from gcs.base.errors import GcsError

__all__ = ["Background", "race", "shielded"]

log = structlog.get_logger("gcs.base.background")
T = TypeVar("T")


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

    def start(self, work: Coroutine[Any, Any, T], name: str = "") -> asyncio.Task[T]:
        """:meth:`spawn` from a coroutine (an event loop runs): the task, never None."""
        task = self.spawn(work, name)
        if task is None:
            raise RuntimeError(f"{self.owner}: no running event loop")
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


async def race(*works: Awaitable[Any]) -> list[asyncio.Future[Any]]:
    """Run ``works`` together until the first one ends; cancel the others and wait until
    they ended; return them all, in order, as futures (the caller reads which is done and
    its result or exception).  Pass ``asyncio.shield(task)`` for a task that must outlive
    the race.  Cancelled while racing, every work is cancelled."""
    futures: list[asyncio.Future[Any]] = [asyncio.ensure_future(work) for work in works]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        losers = [f for f in futures if not f.done()]
        for loser in losers:
            loser.cancel()
        await asyncio.gather(*losers, return_exceptions=True)
    return futures


async def shielded(work: Coroutine[Any, Any, T]) -> T:
    """``await work``, finished even if the caller is cancelled meanwhile (a store write and
    the step applying it are never cut in half): the cancellation goes on once ``work``
    ended; ``work``'s own failure is then retrieved (the caller is gone, it only gets
    cancelled)."""
    inner = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        while not inner.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({inner})
        if not inner.cancelled():
            inner.exception()
        raise
