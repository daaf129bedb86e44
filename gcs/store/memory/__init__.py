"""The memory backend (``memory://``): one process's dicts, gone with it; HA by handles
over one shared store (tests), never across processes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gcs.store.memory.store import MemoryStore

if TYPE_CHECKING:
    from gcs.store.settings import StoreSettings

__all__ = ["MemoryStore", "build"]


def build(url: str, settings: StoreSettings) -> MemoryStore:
    """The registry's factory (:mod:`gcs.store.registry`)."""
    return MemoryStore(url, ha=settings.ha, clock=settings.clock)
