"""Apply the store's Alembic migrations programmatically.

Where the scripts live: ``gcs/store/sql/migrations`` (the one location; they ship inside the
installed package through pyproject package-data ``gcs.store.sql: migrations/**/*``).  The
repository's ``alembic.ini`` points there for running Alembic by hand.

Migrations run on the caller's async engine through ``AsyncConnection.run_sync``: Alembic's
synchronous API drives the async driver via SQLAlchemy's greenlet bridge, so network I/O
still happens on the event loop without blocking it.  This module knows the scripts and the
version table, never the store (``gcs.store.sql.upgrade`` opens one to upgrade a database).
"""

from __future__ import annotations

import pathlib

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from gcs.store.sql.schema import VERSION_TABLE

__all__ = [
    "alembic_config",
    "current_revision",
    "head_revision",
    "migrations_dir",
    "upgrade_connection",
]

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


def migrations_dir() -> pathlib.Path:
    """Directory with ``env.py`` and ``versions/``."""
    candidate = _PACKAGE_DIR / "migrations"
    if (candidate / "env.py").is_file():
        return candidate
    raise FileNotFoundError(
        f"gcs store migrations not found under {_PACKAGE_DIR / 'migrations'}; "
        "the installation is incomplete"
    )


def alembic_config(connection: Connection | None = None) -> Config:
    """An in-memory Alembic config; ``connection`` is shared with ``env.py`` when given."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    """Revision recorded in the database (None: never migrated)."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def upgrade_connection(connection: Connection, revision: str = "head") -> None:
    """Upgrade the schema on ``connection`` (a sync facade from ``run_sync``)."""
    command.upgrade(alembic_config(connection), revision)
