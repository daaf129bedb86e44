"""The SQL backend (``sqlite://``, ``postgresql+asyncpg://``) over SQLAlchemy's asyncio.

Modules, each importing only those above it in this list: ``url`` (normalising a URL),
``schema`` (the tables), ``migrate`` (Alembic over ``migrations/``), ``ha`` (lease
statements, PostgreSQL notifications), ``options``, ``store``
(:class:`~gcs.store.sql.store.SqlStore`), ``upgrade`` (``gcs db upgrade``).

Nothing here is imported by the package itself: a GCS on Redis never imports SQLAlchemy.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gcs.store.base import Store
    from gcs.store.settings import StoreSettings

__all__ = ["SQLITE_FILE", "build", "ray_rocksdb_url"]

SQLITE_FILE = "gcs.sqlite3"
"""The database file in the directory Ray's ``gcs_storage_path`` names (``rocksdb``)."""


def build(url: str, settings: StoreSettings) -> Store:
    """The registry's factory (:mod:`gcs.store.registry`); imports SQLAlchemy on first use."""
    from gcs.store.sql.store import SqlStore

    return SqlStore(url, namespace=settings.namespace, ha=settings.ha, clock=settings.clock)


def ray_rocksdb_url(storage_path: str) -> str:
    """Ray's ``gcs_storage=rocksdb`` in ``gcs_storage_path``: a SQLite file there."""
    if not storage_path:
        raise ValueError("gcs_storage=rocksdb needs gcs_storage_path (a directory)")
    directory = pathlib.Path(storage_path).expanduser().resolve()
    return f"sqlite+aiosqlite:///{directory / SQLITE_FILE}"
