"""SQL backend specifics: URLs, SQLite durability settings, migrations and the db CLI."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
import uuid

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from gcs.cli.store import db
from gcs.store import StoreCorrupt, StoreUnavailable
from gcs.store.factory import store_from_url
from gcs.store.sql.migrate import head_revision, migrations_dir
from gcs.store.sql.store import SqlStore
from gcs.store.sql.upgrade import upgrade
from gcs.store.sql.url import normalize_sql_url
from gcs.testing.postgres import PostgresServer


@pytest.fixture(params=["sqlite", "postgres"])
def durable_sql_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    """A private database (SQLite file or fresh PostgreSQL database) a test may damage."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'own.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database(f"d{uuid.uuid4().hex[:10]}")


class TestUrls:
    """Plain sqlite:// and postgres(ql):// URLs are mapped onto the async drivers."""

    @pytest.mark.parametrize(
        ("given", "expected"),
        [
            ("sqlite:///a/b.db", "sqlite+aiosqlite:///a/b.db"),
            ("sqlite+aiosqlite:////abs.db", "sqlite+aiosqlite:////abs.db"),
            ("postgres://u@h:1/db", "postgresql+asyncpg://u@h:1/db"),
            ("postgresql://u:p@h/db", "postgresql+asyncpg://u:p@h/db"),
            ("postgresql+asyncpg://h/db", "postgresql+asyncpg://h/db"),
        ],
    )
    def test_known_schemes_map_to_async_drivers(self, given: str, expected: str) -> None:
        """Each accepted spelling ends up on aiosqlite or asyncpg."""
        assert normalize_sql_url(given) == expected

    @pytest.mark.parametrize("url", ["postgresql+psycopg2://h/db", "mysql://h/db", "nourl"])
    def test_other_drivers_are_rejected(self, url: str) -> None:
        """Synchronous or foreign drivers are a ValueError naming the accepted forms."""
        with pytest.raises(ValueError, match="storage URL"):
            normalize_sql_url(url)

    def test_factory_builds_a_sql_store_for_postgres_urls(self) -> None:
        """store_from_url routes postgres:// to SqlStore with the namespace."""
        store = store_from_url("postgres://u@h/db", namespace="ns")
        assert isinstance(store, SqlStore)
        assert store.namespace == "ns"


class TestSqliteDurability:
    """SQLite runs in WAL mode with synchronous=FULL and fails cleanly on a bad path."""

    async def test_connections_use_wal_and_full_sync(self, tmp_path: pathlib.Path) -> None:
        """journal_mode is WAL on disk; every pooled connection has synchronous=FULL (2)."""
        store = SqlStore(f"sqlite:///{tmp_path / 'x.db'}")
        await store.open()
        try:
            async with store._read() as conn:
                assert (await conn.execute(text("PRAGMA synchronous"))).scalar_one() == 2
                assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar_one() == 5000
        finally:
            await store.close()
        with sqlite3.connect(tmp_path / "x.db") as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    async def test_missing_parent_directories_are_created(self, tmp_path: pathlib.Path) -> None:
        """sqlite:///deep/dir/gcs.db works without creating deep/dir first."""
        store = SqlStore(f"sqlite:///{tmp_path / 'deep' / 'dir' / 'gcs.db'}")
        await store.open()
        await store.put("KV", b"k", b"v")
        await store.close()
        assert (tmp_path / "deep" / "dir" / "gcs.db").is_file()

    async def test_unusable_path_is_unavailable(self, tmp_path: pathlib.Path) -> None:
        """A path under a regular file cannot be opened: StoreUnavailable, not OSError."""
        (tmp_path / "file").write_text("not a directory")
        with pytest.raises(StoreUnavailable):
            await SqlStore(f"sqlite:///{tmp_path / 'file' / 'gcs.db'}").open()


class TestMigrations:
    """open() and `gcs db upgrade` bring any database to the head revision."""

    def test_scripts_are_found_and_head_is_known(self) -> None:
        """The packaged migrations directory has env.py and a head revision."""
        assert (migrations_dir() / "env.py").is_file()
        assert head_revision() == "0004"

    async def test_open_migrates_a_fresh_database_to_head(self, tmp_path: pathlib.Path) -> None:
        """A new SQLite file ends up at head with both tables."""
        store = SqlStore(f"sqlite:///{tmp_path / 'fresh.db'}")
        await store.open()
        try:
            assert await store.schema_revision() == head_revision()
        finally:
            await store.close()
        with sqlite3.connect(tmp_path / "fresh.db") as raw:
            tables = {
                r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
        assert {"gcs_kv", "gcs_counters", "gcs_alembic_version"} <= tables

    async def test_upgrade_function_is_idempotent(self, tmp_path: pathlib.Path) -> None:
        """upgrade(url) twice leaves the database at head and its data intact."""
        url = f"sqlite:///{tmp_path / 'u.db'}"
        assert await upgrade(url) == head_revision()
        async with SqlStore(url) as store:
            await store.put("KV", b"k", b"v")
        assert await upgrade(url) == head_revision()
        async with SqlStore(url) as store:
            assert await store.get("KV", b"k") == b"v"

    def test_db_upgrade_command_reports_the_revision(self, tmp_path: pathlib.Path) -> None:
        """`db upgrade --storage URL` exits 0 and prints the revision."""
        result = CliRunner().invoke(db, ["upgrade", "--storage", f"sqlite:///{tmp_path / 'c.db'}"])
        assert result.exit_code == 0, result.output
        assert "revision 0004" in result.output

    def test_db_upgrade_command_rejects_non_sql_urls(self) -> None:
        """Redis and memory URLs have no schema: a usage error."""
        result = CliRunner().invoke(db, ["upgrade", "--storage", "redis://localhost:1/0"])
        assert result.exit_code != 0
        assert "only SQL storage URLs" in result.output

    async def test_unknown_schema_revision_is_corrupt(self, tmp_path: pathlib.Path) -> None:
        """A database stamped by a newer gcs (unknown revision) is StoreCorrupt."""
        url = f"sqlite:///{tmp_path / 'newer.db'}"
        await upgrade(url)
        with sqlite3.connect(tmp_path / "newer.db") as raw:
            raw.execute("UPDATE gcs_alembic_version SET version_num = 'ffff'")
        with pytest.raises(StoreCorrupt):
            await SqlStore(url).open()

    async def test_concurrent_opens_of_a_fresh_postgres_database_all_succeed(
        self, postgres_server: PostgresServer
    ) -> None:
        """Several stores migrating one new database at once serialise on the lock."""
        url = postgres_server.create_database(f"m{uuid.uuid4().hex[:10]}")
        stores = [SqlStore(url, namespace=f"n{i}") for i in range(4)]
        await asyncio.gather(*(s.open() for s in stores))
        try:
            for store in stores:
                assert await store.schema_revision() == head_revision()
        finally:
            for store in stores:
                await store.close()


class TestErrorMapping:
    """Driver errors become the most specific StoreError."""

    async def test_missing_table_is_corrupt_not_unavailable(self, durable_sql_url: str) -> None:
        """A table dropped behind the store's back is StoreCorrupt (schema), on both engines."""
        store = SqlStore(durable_sql_url, namespace=uuid.uuid4().hex)
        await store.open()
        try:
            async with store._write() as conn:
                await conn.execute(text("DROP TABLE gcs_kv"))
            with pytest.raises(StoreCorrupt):
                await store.get("KV", b"k")
            with pytest.raises(StoreCorrupt):
                await store.put("KV", b"k", b"v")
        finally:
            await store.close()
