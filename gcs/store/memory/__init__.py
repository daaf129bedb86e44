"""The memory backend (``memory://``): one process's dicts, gone with it; HA by handles
over one shared store (tests), never across processes."""

from gcs.store.memory.store import MemoryStore

__all__ = ["MemoryStore"]
