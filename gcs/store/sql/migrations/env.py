"""Alembic environment for the gcs store (async engines: aiosqlite, asyncpg).

Two ways in:

* programmatic (``gcs.store.sql.migrate``): the caller passes an open *sync-facade* connection in
  ``config.attributes["connection"]`` (from ``AsyncConnection.run_sync``), so migrations run on
  the caller's engine inside its transaction and never block the event loop;
* command line (``alembic -x url=sqlite:///gcs.db upgrade head`` from the repository root, or
  ``GCS_STORAGE_URL``): this module builds its own async engine and runs ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from gcs.store.sql.schema import METADATA, VERSION_TABLE
from gcs.store.sql.url import normalize_sql_url

config = context.config


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=METADATA,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _url_from_cli() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get("GCS_STORAGE_URL")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise SystemExit("no database URL: pass -x url=... or set GCS_STORAGE_URL")
    return normalize_sql_url(url)


async def _run_online_async() -> None:
    engine = create_async_engine(_url_from_cli())
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_configure_and_run)
    finally:
        await engine.dispose()


def _run_offline() -> None:
    context.configure(
        url=_url_from_cli(),
        target_metadata=METADATA,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    _run_offline()
elif (shared := config.attributes.get("connection")) is not None:
    _configure_and_run(shared)
else:
    asyncio.run(_run_online_async())
