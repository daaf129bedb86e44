"""Store errors, translated at the backend boundary (redis / SQLAlchemy never leak out).

They are domain errors (:class:`gcs.base.errors.GcsError`), so callers catch one family, and
what a client may conclude stays apart:

StoreError                  base: anything the store could not do
├── StoreUnavailable        (an ``Unavailable``) backend unreachable / timed out / refused;
│   │                       the write was NOT applied ("nothing was written")
│   ├── StoreFull           the backend refused the write for want of space (Redis at
│   │                       ``maxmemory`` with noeviction, SQLite / PostgreSQL disk full)
│   └── StoreUnreachable    opening the store failed for the whole retry budget (startup)
├── StoreOutcomeUnknown     (an ``Unavailable``) the write may or may not have landed
│                           (see Store.landed)
├── StoreFenced             (an ``Unavailable``) an HA ex-leader's write: a newer lease
│                           epoch exists; nothing was written (gcs.store.ha)
├── ChangesTrimmed          a change-stream cursor older than what the stream holds
├── StoreConflict           a compare-and-set condition did not hold; nothing applied
└── StoreCorrupt            stored bytes or schema are not what we wrote
"""

from __future__ import annotations

from gcs.base.errors import GcsError, Unavailable

__all__ = [
    "ChangesTrimmed",
    "StoreConflict",
    "StoreCorrupt",
    "StoreError",
    "StoreFenced",
    "StoreFull",
    "StoreOutcomeUnknown",
    "StoreUnavailable",
    "StoreUnreachable",
]


class StoreError(GcsError):
    """Base class of every error raised by a :class:`gcs.store.Store`."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)


class StoreUnavailable(StoreError, Unavailable):
    """The backend could not be reached or refused; the operation was not applied."""


class StoreFull(StoreUnavailable):
    """The backend refused the write because it is out of memory or disk; nothing was
    written.  Counted apart (``gcs_store_failures{outcome="full"}``): an operator must free
    space or raise the limit, retrying alone will not help."""


class StoreUnreachable(StoreUnavailable):
    """Opening the store failed on every attempt of its retry budget
    (:func:`gcs.store.factory.open_with_retry`): ``attempts`` made over ``waited_s``."""

    def __init__(self, message: str, *, attempts: int, waited_s: float) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.waited_s = waited_s


class StoreOutcomeUnknown(StoreError, Unavailable):
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


class StoreFenced(StoreError, Unavailable):
    """A write of a fenced store was refused: a newer lease epoch exists.  Nothing was
    written; the caller is no longer the leader (:mod:`gcs.store.ha`)."""

    def __init__(self, fence_epoch: int, current_epoch: int) -> None:
        super().__init__(
            f"write refused: lease epoch {fence_epoch} was superseded by {current_epoch}"
        )
        self.fence_epoch = fence_epoch
        self.current_epoch = current_epoch


class ChangesTrimmed(StoreError):
    """The cursor points before the oldest change the stream still holds."""
