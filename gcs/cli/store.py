"""``gcs db ...``: schema management for the SQL storage backends (mounted by gcs/cli/main.py)."""

from __future__ import annotations

import asyncio

import click

from gcs.cli.support import GcsGroup, dumps, format_option, one_line
from gcs.config import storage_url_problem
from gcs.store.errors import StoreError

__all__ = ["db"]


@click.group("db", cls=GcsGroup)
def db() -> None:
    """Manage the SQL storage schema (SQLite / PostgreSQL)."""


@db.command("upgrade")
@click.option(
    "--storage",
    "url",
    required=True,
    envvar="GCS_STORAGE_URL",
    help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB (else GCS_STORAGE_URL).",
)
@format_option()
def upgrade_command(url: str, fmt: str) -> None:
    """Apply pending migrations (idempotent; safe while servers run)."""
    from gcs.store.sql.upgrade import upgrade

    scheme = url.split("://", 1)[0].lower()
    if not scheme.startswith(("sqlite", "postgres")):
        raise click.BadParameter("only SQL storage URLs have a schema", param_hint="--storage")
    problem = storage_url_problem(url)
    if problem:
        raise click.BadParameter(problem, param_hint="--storage")
    try:
        revision = asyncio.run(upgrade(url))
    except (StoreError, ValueError) as err:
        raise click.ClickException(one_line(str(err))) from None
    if fmt == "json":
        click.echo(dumps({"revision": revision}))
    else:
        click.echo(f"schema at revision {revision}")
