"""``gcs db upgrade``: bring a database's schema to head by opening a store on it (the
store's ``open()`` upgrades under its lock; the scripts: :mod:`gcs.store.sql.migrate`)."""

from __future__ import annotations

from gcs.store.sql.store import SqlStore

__all__ = ["upgrade"]


async def upgrade(url: str) -> str | None:
    """Upgrade the database at ``url`` to head; return the revision it is at afterwards.

    Safe to run while gcs servers use the database and from several processes at once
    (PostgreSQL: advisory lock; SQLite: the write lock).  Raises :class:`StoreError`.
    """
    store = SqlStore(url)
    await store.open()  # open() upgrades under the lock
    try:
        return await store.schema_revision()
    finally:
        await store.close()
