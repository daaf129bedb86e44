"""A leader term's store that answers every pending call when the term steps down (issue 29
item 2: no stranded calls).

A leader cut off from its store stops admitting calls when its trusted lease ends, but the
calls it admitted before may be waiting on the store (a write sent into a blackhole).  When
the term ends, :meth:`TermStore.cut` fails every call still waiting -- and every later one
-- at once: a write or an increment with :class:`StoreOutcomeUnknown` (the client hears
UNAVAILABLE "the write may have been applied"), a read with :class:`StoreUnavailable`.  The
store's own call is left to finish or fail by itself (cancelling it midway could leave the
member's shared connection in a bad state); its result is no one's any more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from gcs.base.background import Background
from gcs.server.ha_mirror import TableMirror, TakeoverStore
from gcs.store import Store
from gcs.store.base import WriteBatch
from gcs.store.errors import StoreError, StoreOutcomeUnknown, StoreUnavailable

__all__ = ["STEPPED_DOWN", "TermStore"]

T = TypeVar("T")

STEPPED_DOWN = "this GCS stepped down while the call waited on the store"


class TermStore(TakeoverStore):
    """:class:`TakeoverStore` whose store calls end at :meth:`cut` (see the module doc)."""

    def __init__(
        self, store: Store, mirror: TableMirror | None, *, on_fenced: Callable[[], None]
    ) -> None:
        super().__init__(store, mirror, on_fenced=on_fenced)
        self._cut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._calls = Background("term-store")
        """Each store call runs as its own task, so that a cut can answer its caller."""
        self._waiting = 0
        self.stranded = 0
        """Calls that were waiting on the store when it was cut (each answered then)."""

    @property
    def is_cut(self) -> bool:
        return self._cut.done()

    def cut(self) -> None:
        """The term ended: every pending and later store call fails now."""
        if not self._cut.done():
            self.stranded = self._waiting
            self._cut.set_result(None)

    async def _through(self, call: Coroutine[Any, Any, T], error: Callable[[], StoreError]) -> T:
        if self._cut.done():  # never sent: certainly not written
            call.close()
            raise StoreUnavailable("this GCS stepped down; nothing was written")
        task = self._calls.start(_outcome(call), "store-call")
        self._waiting += 1
        try:
            await asyncio.wait((task, self._cut), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()  # the caller went away: as if it had awaited the call itself
            raise
        finally:
            self._waiting -= 1
        if task.done() and not self._cut.done():
            result, failure = task.result()
            if failure is not None:
                raise failure
            return cast(T, result)
        raise error()  # a call that finishes later: its outcome is no one's

    @staticmethod
    def _unread() -> StoreError:
        return StoreUnavailable(f"{STEPPED_DOWN}; nothing was written")

    async def get(self, table: str, key: bytes) -> bytes | None:
        return await self._through(super().get(table, key), self._unread)

    async def multi_get(self, table: str, keys: Any) -> dict[bytes, bytes]:
        return await self._through(super().multi_get(table, keys), self._unread)

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return await self._through(super().get_all(table), self._unread)

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        return await self._through(super().scan_prefix(table, prefix), self._unread)

    async def scan_keys(self, table: str, prefix: bytes, *, max_bytes: int) -> list[bytes] | None:
        return await self._through(
            super().scan_keys(table, prefix, max_bytes=max_bytes), self._unread
        )

    async def read_counter(self, counter: str) -> int:
        return await self._through(super().read_counter(counter), self._unread)

    async def write(self, batch: WriteBatch) -> None:
        await self._through(super().write(batch), lambda: _unknown(batch.write_id))

    async def landed(self, write_id: bytes) -> bool:
        return await self._through(super().landed(write_id), lambda: _unknown(write_id))

    async def increment(self, counter: str, by: int = 1) -> int:
        return await self._through(super().increment(counter, by), lambda: _unknown(b""))


def _unknown(write_id: bytes) -> StoreOutcomeUnknown:
    return StoreOutcomeUnknown(write_id, f"{STEPPED_DOWN}; the write may have been applied")


async def _outcome(call: Coroutine[Any, Any, T]) -> tuple[T | None, Exception | None]:
    """The call's result or its error, as a value (the error is the caller's, not the
    task's: nothing to log for it)."""
    try:
        return await call, None
    except Exception as err:
        return None, err
