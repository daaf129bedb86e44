"""A member's store handle behind a simulated network link, on the injected clock (the
partition suite's small runs: ``tests/server/test_ha_grey.py``).

:class:`LinkStore` is a :class:`MemoryStore` handle over a shared store whose every call
crosses a link: ``request_s`` before the store runs it (one-way latency towards the store),
``reply_s`` after (back), and while ``blackhole`` is set a call waits where it is -- sent
calls are held until the link heals (TCP retransmits them then), as a dropped-packets
partition does.  ``after`` sees each call's name once the store ran it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from gcs.base.clock import Clock
from gcs.store.base import WriteBatch
from gcs.store.ha import ChangeCursor, LeaseInfo
from gcs.store.memory import MemoryStore

__all__ = ["LinkStore"]

T = TypeVar("T")


class LinkStore(MemoryStore):
    """See the module docstring; build with :meth:`over`."""

    clock: Clock
    request_s: float
    reply_s: float
    after: Callable[[str], None] | None
    _healed: asyncio.Event

    @classmethod
    def over(cls, shared: MemoryStore, clock: Clock) -> LinkStore:
        view = cls.__new__(cls)
        view._attach(shared.url, shared._shared)
        view.clock = clock
        view.request_s = view.reply_s = 0.0
        view.after = None
        view._healed = asyncio.Event()
        view._healed.set()
        return view

    @property
    def blackhole(self) -> bool:
        return not self._healed.is_set()

    @blackhole.setter
    def blackhole(self, on: bool) -> None:
        if on:
            self._healed.clear()
        else:
            self._healed.set()

    async def _cross(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        await self._healed.wait()
        if self.request_s:
            await self.clock.sleep(self.request_s)
        await self._healed.wait()
        result = await call()
        if self.after is not None:
            self.after(name)
        await self._healed.wait()
        if self.reply_s:
            await self.clock.sleep(self.reply_s)
        await self._healed.wait()
        return result

    async def get(self, table: str, key: bytes) -> bytes | None:
        return await self._cross("get", lambda: super(LinkStore, self).get(table, key))

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        keys = list(keys)
        return await self._cross("get", lambda: super(LinkStore, self).multi_get(table, keys))

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return await self._cross("get", lambda: super(LinkStore, self).get_all(table))

    async def write(self, batch: WriteBatch) -> None:
        await self._cross("write", lambda: super(LinkStore, self).write(batch))

    async def landed(self, write_id: bytes) -> bool:
        return await self._cross("landed", lambda: super(LinkStore, self).landed(write_id))

    async def increment(self, counter: str, by: int = 1) -> int:
        return await self._cross("increment", lambda: super(LinkStore, self).increment(counter, by))

    async def try_acquire_lease(self, holder: str, ttl_ms: int) -> int | None:
        return await self._cross(
            "acquire", lambda: super(LinkStore, self).try_acquire_lease(holder, ttl_ms)
        )

    async def renew_lease(
        self, holder: str, epoch: int, ttl_ms: int, *, min_left_ms: int = 0
    ) -> bool:
        return await self._cross(
            "renew",
            lambda: super(LinkStore, self).renew_lease(
                holder, epoch, ttl_ms, min_left_ms=min_left_ms
            ),
        )

    async def release_lease(self, holder: str, epoch: int) -> None:
        await self._cross("release", lambda: super(LinkStore, self).release_lease(holder, epoch))

    async def read_lease(self) -> LeaseInfo | None:
        return await self._cross("read_lease", lambda: super(LinkStore, self).read_lease())

    async def change_cursor(self) -> ChangeCursor:
        return await self._cross("cursor", lambda: super(LinkStore, self).change_cursor())

    async def read_changes(
        self, after: ChangeCursor, *, block_ms: int = 0, limit: int = 10_000
    ) -> tuple[ChangeCursor, list[Any]]:
        return await self._cross(
            "changes",
            lambda: super(LinkStore, self).read_changes(after, block_ms=block_ms, limit=limit),
        )
