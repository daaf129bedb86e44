"""A toy store backend: the one module a new backend is (with one row in ``STORES``).

Built on the memory store, it records what the server did with it."""

from __future__ import annotations

from gcs.store.base import WriteBatch
from gcs.store.factory import StoreSettings
from gcs.store.memory import MemoryStore


class ToyStore(MemoryStore):
    def __init__(self, url: str, settings: StoreSettings) -> None:
        super().__init__(url)
        self.namespace = settings.namespace
        self.opened = self.closed = False
        self.writes = 0

    async def open(self) -> None:
        await super().open()
        self.opened = True

    async def close(self) -> None:
        await super().close()
        self.closed = True

    async def write(self, batch: WriteBatch) -> None:
        self.writes += 1
        await super().write(batch)
