"""Components with a lifecycle, and the one supervisor that runs them.

A component is ``load()`` (read the store, build in-memory state; serves nothing and starts
no background work), ``run()`` (serve or loop until cancelled; returning early means "done",
raising means "failed"), ``close()`` (release what it holds; idempotent, and safe after a
failed or missing ``load()``).

The :class:`Supervisor` loads components in order, runs them all in one task group (the
first failure cancels the rest and is raised), and closes them in reverse order.  A hot
standby is the same components after ``load()``, not yet ``run()``.

Most parts of the GCS are objects whose load / run / close have other names (a manager's
``load``, a poller's ``run``, a gateway's ``close``); the wiring adapts each with a
:class:`Part`, so the component list reads as one table.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol, runtime_checkable

import structlog

log = structlog.get_logger("gcs.base.lifecycle")

__all__ = ["Component", "ComponentFailed", "Part", "Supervisor", "start_until_ready"]

Step = Callable[[], Awaitable[object]]


@runtime_checkable
class Component(Protocol):
    @property
    def name(self) -> str:
        """Short, stable, used in logs and in :class:`ComponentFailed`."""
        ...

    async def load(self) -> None: ...

    async def run(self) -> None: ...

    async def close(self) -> None: ...


class Part:
    """A component made of up to three async callables (each optional: a part with no
    ``run`` is done once loaded, one with no ``load`` has nothing to read)."""

    def __init__(
        self,
        name: str,
        *,
        load: Step | None = None,
        run: Step | None = None,
        close: Step | None = None,
    ) -> None:
        self._name = name
        self._load, self._run, self._close = load, run, close

    @property
    def name(self) -> str:
        return self._name

    async def load(self) -> None:
        if self._load is not None:
            await self._load()

    async def run(self) -> None:
        if self._run is not None:
            await self._run()

    async def close(self) -> None:
        if self._close is not None:
            await self._close()

    def __repr__(self) -> str:
        return f"Part({self._name!r})"


class ComponentFailed(Exception):
    """A component's ``load()`` or ``run()`` raised; every component was then stopped."""

    def __init__(self, name: str, phase: str, cause: BaseException) -> None:
        super().__init__(f"{name} failed in {phase}: {cause!r}")
        self.name = name
        self.phase = phase
        self.cause = cause


class Supervisor:
    """load() in order -> run() all at once -> close() in reverse order.

    ``run()`` returns when every component's ``run()`` returned, or when :meth:`stop` was
    called; it raises :class:`ComponentFailed` for the first component that failed.
    """

    def __init__(self, components: Sequence[Component]) -> None:
        names = [c.name for c in components]
        if len(set(names)) != len(names):
            raise ValueError(f"component names must be unique: {names}")
        self.components = list(components)
        self._loaded: list[Component] = []
        self._stop = asyncio.Event()
        self._closed = False

    async def load(self) -> None:
        for component in self.components:
            self._loaded.append(component)  # closed even if its load() fails halfway
            try:
                await component.load()
            except Exception as err:
                await self.close()
                raise ComponentFailed(component.name, "load", err) from err

    async def run(self) -> None:
        tasks = [
            asyncio.create_task(self._run_one(c), name=f"component:{c.name}")
            for c in self.components
        ]
        stopper: asyncio.Task[Any] = asyncio.create_task(self._stop.wait(), name="supervisor:stop")
        pending: set[asyncio.Task[Any]] = set(tasks)
        try:
            while pending:
                done, _ = await asyncio.wait(
                    pending | {stopper}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopper in done:
                    return
                for task in done:
                    pending.discard(task)
                    failure = task.exception()
                    if failure is not None:
                        raise failure
        finally:
            for started in [*tasks, stopper]:
                started.cancel()
            await asyncio.gather(*tasks, stopper, return_exceptions=True)

    async def _run_one(self, component: Component) -> None:
        try:
            await component.run()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.error("component.failed", component=component.name, error=repr(err))
            raise ComponentFailed(component.name, "run", err) from err

    def stop(self) -> None:
        """Ask :meth:`run` to cancel every component and return."""
        self._stop.set()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for component in reversed(self._loaded):
            try:
                await component.close()
            except Exception as err:
                log.error("component.close_failed", component=component.name, error=repr(err))


async def start_until_ready(
    run: Coroutine[Any, Any, None], ready: Awaitable[object], *, name: str
) -> asyncio.Task[None]:
    """Start ``run`` (a supervisor's, a lease loop's) as a task named ``name``; return that
    task once ``ready`` (serving, warm) completed -- it keeps running -- or once it ended
    first (then done, and ``ready`` cancelled: the caller tells which and raises).

    "Start, then wait until serving", written once (a plain start, an HA term, a member's
    lease loop).  Cancelled while waiting, both are cancelled."""
    running = asyncio.create_task(run, name=name)
    waiting = asyncio.ensure_future(ready)
    try:
        await asyncio.wait({running, waiting}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        running.cancel()
        waiting.cancel()
        await asyncio.gather(running, waiting, return_exceptions=True)
        raise
    if not waiting.done():
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    return running
