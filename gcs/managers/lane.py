"""One serialized apply lane per manager (etcd's apply loop).

Every mutation of a manager runs inside ``async with lane:`` and follows

    validate (read state now, under the lane) -> ``await lane.commit(batch, apply)``
    -> reply

where ``apply`` is a synchronous step that changes memory, tells listeners and publishes.
Only one mutation of a manager is between its check and its apply at any time, so a check
can never be invalidated by another mutation's await.  Reads do not use the lane: they read
the in-memory state directly and never wait for a write.

Ambiguous writes (:class:`~gcs.store.errors.StoreOutcomeUnknown`): the lane asks the store
(:meth:`~gcs.store.Store.landed`) right away, a few times with backoff.  If it landed, the
step is applied and the mutation succeeds; if it did not, the caller gets
``StoreUnavailable`` ("nothing was written", now known to be true).  If the store still
cannot tell, the caller gets the ``StoreOutcomeUnknown`` (UNAVAILABLE, "may have been
applied") and the lane keeps ``(write_id, apply)``: the next mutation first resolves it and
applies the step if the write landed, so memory never diverges from the store.  While it
stays unresolved every later mutation fails with :class:`~gcs.base.errors.Unavailable` without
writing anything.

A caller cancelled mid-write (a cancelled RPC) does not cut a mutation in half: the write and
its apply finish before the lane lets the next mutation in; then the cancellation goes on.

Usage (see NodeManager)::

    async with self._lane:
        if node_id not in self.alive:        # checked under the lane
            return False
        def apply() -> None: ...             # memory, listeners, publish; no awaits
        await self._lane.commit(batch, apply)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import structlog

from gcs.base.background import shielded
from gcs.base.clock import Clock
from gcs.base.errors import Unavailable
from gcs.store import Store, WriteBatch
from gcs.store.errors import StoreOutcomeUnknown, StoreUnavailable

__all__ = ["ApplyLane", "ResolvePolicy"]

log = structlog.get_logger("gcs.lane")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ResolvePolicy:
    """How hard to ask :meth:`Store.landed` before giving up for this call.

    ``attempts`` calls, sleeping ``first_backoff_s`` doubled each time (capped at
    ``max_backoff_s``) between them, on the manager's clock; with the defaults ~0.75 s at
    most per call.
    """

    attempts: int = 4
    first_backoff_s: float = 0.05
    max_backoff_s: float = 0.4


@dataclass(slots=True)
class _Unresolved:
    write_id: bytes
    apply: Callable[[], object]


class ApplyLane:
    """Serializes a manager's mutations and resolves its ambiguous writes.

    Not reentrant: a mutation that needs another one of the same manager calls that
    manager's lane-held helper directly (entering twice from one task raises).
    """

    def __init__(
        self,
        store: Store,
        name: str,
        clock: Clock,
        *,
        policy: ResolvePolicy | None = None,
    ) -> None:
        """``clock``: the manager's; the backoff between ``Store.landed`` questions sleeps
        on it (a test moves it with a FakeClock)."""
        self._store = store
        self.name = name
        self._clock = clock
        self._policy = policy or ResolvePolicy()
        self._lock = asyncio.Lock()
        self._owner: asyncio.Task[object] | None = None
        self._unresolved: _Unresolved | None = None
        self.ambiguous = 0
        """Writes whose outcome the store could not tell at first."""
        self.resolved_landed = 0
        self.resolved_lost = 0

    @property
    def busy(self) -> bool:
        """A mutation holds the lane (listeners may queue work until it ends)."""
        return self._lock.locked()

    @property
    def unresolved(self) -> bool:
        """An ambiguous write is still unresolved (its step is not applied yet)."""
        return self._unresolved is not None

    async def __aenter__(self) -> ApplyLane:
        task = asyncio.current_task()
        if task is not None and task is self._owner:
            raise RuntimeError(f"lane {self.name!r} entered twice by one task")
        await self._lock.acquire()
        self._owner = task
        try:
            await self._settle()
        except BaseException:
            self._release()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        self._owner = None
        self._lock.release()

    async def resolve(self) -> None:
        """Resolve a remembered ambiguous write now (its step applied if it landed);
        raises :class:`~gcs.base.errors.Unavailable` while the store still cannot tell."""
        async with self:
            return

    async def run(self, step: Callable[[], Awaitable[T]]) -> T:
        """``step()`` under the lane."""
        async with self:
            return await step()

    async def commit(self, batch: WriteBatch, apply: Callable[[], T]) -> T:
        """Persist ``batch``, then run ``apply`` (memory, listeners, publish) and return
        its result.  Call it holding the lane.  An empty batch only applies.

        Raises StoreUnavailable (nothing written, nothing applied), StoreOutcomeUnknown
        (remembered; see the module doc), StoreConflict and other store errors as the store
        raised them.
        """
        if not self._lock.locked():
            raise RuntimeError(f"lane {self.name!r}: commit outside the lane")
        if not batch:
            return apply()
        # The caller may go away mid-write (e.g. the RPC was cancelled): the mutation is
        # finished before the lane is released, so it is never left half done.
        return await shielded(self._write_then_apply(batch, apply))

    async def _write_then_apply(self, batch: WriteBatch, apply: Callable[[], T]) -> T:
        try:
            await self._store.write(batch)
        except StoreOutcomeUnknown as err:
            self.ambiguous += 1
            landed = await self._ask(err.write_id)
            if landed is None:
                self._unresolved = _Unresolved(err.write_id, apply)
                log.warning("lane.write_unresolved", lane=self.name, write_id=err.write_id.hex())
                raise
            if not landed:
                self.resolved_lost += 1
                raise StoreUnavailable(f"the write did not land (confirmed after: {err})") from err
            self.resolved_landed += 1
        return apply()

    async def _settle(self) -> None:
        """Resolve a remembered ambiguous write before the next mutation."""
        pending = self._unresolved
        if pending is None:
            return
        landed = await self._ask(pending.write_id)
        if landed is None:
            raise Unavailable(
                "store unavailable: an earlier write's outcome is still unknown; "
                "nothing was written, retry"
            )
        self._unresolved = None
        if landed:
            self.resolved_landed += 1
            pending.apply()
        else:
            self.resolved_lost += 1
        log.info(
            "lane.write_resolved",
            lane=self.name,
            write_id=pending.write_id.hex(),
            landed=landed,
        )

    async def _ask(self, write_id: bytes) -> bool | None:
        """``Store.landed`` with backoff; None while the store still cannot tell."""
        delay = self._policy.first_backoff_s
        for attempt in range(self._policy.attempts):
            if attempt:
                await self._clock.sleep(delay)
                delay = min(delay * 2, self._policy.max_backoff_s)
            try:
                return await self._store.landed(write_id)
            except StoreUnavailable:
                continue
        return None
