"""A version counter that never goes back, even across restarts, without a write per use.

Values are handed out from blocks reserved in the store (``increment(name, block)``); after a
restart the next value is above every block ever reserved, so it is above every value ever
handed out.  Costs one store round trip per ``block`` values.
"""

from __future__ import annotations

import asyncio

from gcs.store import Store


class DurableCounter:
    def __init__(self, store: Store, name: str, *, block: int = 1000) -> None:
        self._store = store
        self._name = name
        self._block = block
        self._value = 0
        self._ceiling = 0
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        self._ceiling = await self._store.read_counter(self._name)
        self._value = self._ceiling

    @property
    def current(self) -> int:
        """The last value handed out (after a restart: the last reserved ceiling)."""
        return self._value

    async def next(self) -> int:
        if self._value >= self._ceiling:
            async with self._lock:
                if self._value >= self._ceiling:
                    self._ceiling = await self._store.increment(self._name, self._block)
                    self._value = max(self._value, self._ceiling - self._block)
        self._value += 1
        return self._value
