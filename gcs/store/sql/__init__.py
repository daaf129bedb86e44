"""The SQL backend (``sqlite://``, ``postgresql+asyncpg://``) over SQLAlchemy's asyncio.

Modules, each importing only those above it in this list: ``url`` (normalising a URL),
``schema`` (the tables), ``migrate`` (Alembic over ``migrations/``), ``ha`` (lease
statements, PostgreSQL notifications), ``options``, ``store``
(:class:`~gcs.store.sql.store.SqlStore`), ``upgrade`` (``gcs db upgrade``).

Nothing here is imported by the package itself: a GCS on Redis never imports SQLAlchemy.
"""
