"""Store errors, translated at the backend boundary (redis / SQLAlchemy never leak out).

StoreError                  base: anything the store could not do
├── StoreUnavailable        backend unreachable / timed out; the write was NOT applied
├── StoreConflict           a compare-and-set condition did not hold; nothing applied
└── StoreCorrupt            stored bytes or schema are not what we wrote
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error raised by a :class:`gcs.store.Store`."""


class StoreUnavailable(StoreError):
    """The backend could not be reached; the operation was not applied."""


class StoreConflict(StoreError):
    """A batch condition failed (compare-and-set); the batch was not applied."""

    def __init__(self, table: str, key: bytes, message: str = "") -> None:
        super().__init__(message or f"condition failed on {table}/{key!r}")
        self.table = table
        self.key = key


class StoreCorrupt(StoreError):
    """Stored data or schema is not what this version of gcs expects."""
