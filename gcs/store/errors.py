"""Store errors, translated at the backend boundary (redis / SQLAlchemy never leak out).

StoreError                  base: anything the store could not do
├── StoreUnavailable        backend unreachable / timed out; the write was NOT applied
├── StoreOutcomeUnknown     the write may or may not have landed (see Store.landed)
├── StoreConflict           a compare-and-set condition did not hold; nothing applied
└── StoreCorrupt            stored bytes or schema are not what we wrote
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error raised by a :class:`gcs.store.Store`."""


class StoreUnavailable(StoreError):
    """The backend could not be reached; the operation was not applied."""


class StoreOutcomeUnknown(StoreError):
    """The backend failed after the write may have reached it (timeout, dropped connection).

    ``write_id`` names the batch; :meth:`gcs.store.Store.landed` answers whether it landed
    once the backend is reachable again.  Callers must resolve it before applying the next
    write so memory and store never diverge, and must not tell a client "nothing was
    written" until :meth:`~gcs.store.Store.landed` said False.
    """

    def __init__(self, write_id: bytes, message: str = "") -> None:
        super().__init__(message or f"outcome of write {write_id.hex()} unknown")
        self.write_id = write_id


class StoreConflict(StoreError):
    """A batch condition failed (compare-and-set); the batch was not applied."""

    def __init__(self, table: str, key: bytes, message: str = "") -> None:
        super().__init__(message or f"condition failed on {table}/{key!r}")
        self.table = table
        self.key = key


class StoreCorrupt(StoreError):
    """Stored data or schema is not what this version of gcs expects."""
