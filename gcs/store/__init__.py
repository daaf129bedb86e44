"""Storage: one async interface (:class:`Store`), backends chosen by URL."""

from gcs.store.base import PRESENT, Condition, Store, WriteBatch
from gcs.store.errors import (
    StoreConflict,
    StoreCorrupt,
    StoreError,
    StoreFull,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from gcs.store.factory import open_store, store_from_url
from gcs.store.outcome import write_definite

__all__ = [
    "PRESENT",
    "Condition",
    "Store",
    "StoreConflict",
    "StoreCorrupt",
    "StoreError",
    "StoreFull",
    "StoreOutcomeUnknown",
    "StoreUnavailable",
    "WriteBatch",
    "open_store",
    "store_from_url",
    "write_definite",
]
