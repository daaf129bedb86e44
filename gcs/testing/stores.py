"""Store wrappers that make races and faults reproducible in tests.

- :class:`YieldingStore` gives the event loop away before and after every store call, so
  any check-await-apply race in a manager shows up deterministically (every interleaving
  point a real backend would have becomes one here).
- :class:`FaultyStore` fails or stalls writes on demand: before the write (nothing landed),
  after it (the write landed but the caller is told it did not: the ambiguous failure a
  Redis timeout or a dropped SQL connection produces), or holds it until released.
- :class:`UnsureStore` (a FaultyStore) also cannot tell, for a while, whether a write landed.

All wrap any :class:`~gcs.store.Store`; reads and counters pass through.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable

from gcs.store.base import Store, WriteBatch
from gcs.store.errors import StoreOutcomeUnknown, StoreUnavailable

__all__ = ["FaultyStore", "UnsureStore", "WriteFault", "YieldingStore"]


class _Delegating(Store):
    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def get(self, table: str, key: bytes) -> bytes | None:
        return await self.inner.get(table, key)

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        return await self.inner.multi_get(table, keys)

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return await self.inner.get_all(table)

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        return await self.inner.scan_prefix(table, prefix)

    async def write(self, batch: WriteBatch) -> None:
        await self.inner.write(batch)

    async def landed(self, write_id: bytes) -> bool:
        return await self.inner.landed(write_id)

    async def increment(self, counter: str, by: int = 1) -> int:
        return await self.inner.increment(counter, by)

    async def read_counter(self, counter: str) -> int:
        return await self.inner.read_counter(counter)


class YieldingStore(_Delegating):
    """Yields to the loop ``yields`` times before and after every call."""

    def __init__(self, inner: Store, *, yields: int = 2) -> None:
        super().__init__(inner)
        self._yields = yields

    async def _yield(self) -> None:
        for _ in range(self._yields):
            await asyncio.sleep(0)

    async def get(self, table: str, key: bytes) -> bytes | None:
        await self._yield()
        out = await self.inner.get(table, key)
        await self._yield()
        return out

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        await self._yield()
        out = await self.inner.multi_get(table, keys)
        await self._yield()
        return out

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        await self._yield()
        out = await self.inner.scan_prefix(table, prefix)
        await self._yield()
        return out

    async def write(self, batch: WriteBatch) -> None:
        await self._yield()
        await self.inner.write(batch)
        await self._yield()

    async def increment(self, counter: str, by: int = 1) -> int:
        await self._yield()
        out = await self.inner.increment(counter, by)
        await self._yield()
        return out


class WriteFault(enum.Enum):
    BEFORE = "before"
    """Raise StoreUnavailable without writing: nothing landed."""
    AFTER = "after"
    """Write, then raise StoreOutcomeUnknown: the write landed, the caller cannot know."""
    STALL = "stall"
    """Block the write until :meth:`FaultyStore.release` (then it is applied)."""


class FaultyStore(_Delegating):
    """Injects one fault per queued entry into the next writes (``fail_next``)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self._faults: list[WriteFault] = []
        self._release = asyncio.Event()
        self.stalled = 0
        self.writes_seen = 0

    def fail_next(self, fault: WriteFault, times: int = 1) -> None:
        self._faults.extend([fault] * times)

    def release(self) -> None:
        """Let stalled writes continue (and every later STALL pass at once)."""
        self._release.set()

    def clear(self) -> None:
        self._faults.clear()

    async def write(self, batch: WriteBatch) -> None:
        self.writes_seen += 1
        fault = self._faults.pop(0) if self._faults else None
        if fault is WriteFault.BEFORE:
            raise StoreUnavailable("faulty store: injected failure before the write")
        if fault is WriteFault.STALL:
            self.stalled += 1
            await self._release.wait()
        await self.inner.write(batch)
        if fault is WriteFault.AFTER:
            raise StoreOutcomeUnknown(batch.write_id, "faulty store: failed after the write")


class UnsureStore(FaultyStore):
    """A FaultyStore whose :meth:`landed` cannot tell (raises StoreUnavailable) the next
    ``unsure`` times: an ambiguous write that stays unresolved for a while."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.unsure = 0
        self.asked = 0

    async def landed(self, write_id: bytes) -> bool:
        self.asked += 1
        if self.unsure > 0:
            self.unsure -= 1
            raise StoreUnavailable("unsure store: cannot tell yet whether the write landed")
        return await self.inner.landed(write_id)
