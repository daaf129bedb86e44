"""A store written in the old KV layout (empty-namespace keys raw, cluster id only in KV)
opens, is migrated once, and reads the same KV contents and cluster id; opening again
changes nothing (SQL: Alembic 0003; Redis: the layout script run by open())."""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Callable

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import create_async_engine

from gcs.managers.kv import KvManager
from gcs.server import GcsServer
from gcs.store.base import META_CLUSTER_ID, META_SESSION_NAME, TABLE_KV, TABLE_META, Store
from gcs.store.redis.store import RedisStore
from gcs.store.sql import migrate
from gcs.store.sql.schema import KV
from gcs.store.sql.store import SqlStore
from gcs.store.sql.url import normalize_sql_url
from gcs.testing.postgres import PostgresServer
from gcs.testing.redis_server import RedisServer
from tests.conftest import fast_config

CLUSTER_ID = bytes(range(28))

# Old stored key -> value, and what each old key meant (namespace, key).
OLD_ROWS = {
    b"@namespace_cluster:ray_cluster_id": CLUSTER_ID,
    b"@namespace_session:session_name": b"session_old",
    b"@namespace_job:j1": b"job-1",
    b"@namespace_a%b:k": b"percent",
    b"plain": b"empty-ns",
    b"@namespace_:weird": b"empty-ns-weird",
    b"@namespace_nocolon": b"empty-ns-nocolon",
}
MEANING = {
    (b"cluster", b"ray_cluster_id"): CLUSTER_ID,
    (b"session", b"session_name"): b"session_old",
    (b"job", b"j1"): b"job-1",
    (b"a%b", b"k"): b"percent",
    (b"", b"plain"): b"empty-ns",
    (b"", b"@namespace_:weird"): b"empty-ns-weird",
    (b"", b"@namespace_nocolon"): b"empty-ns-nocolon",
}


async def _assert_same_contents(store: Store) -> None:
    kv = KvManager(store)
    for (namespace, key), value in MEANING.items():
        assert await kv.get(namespace, key) == value, (namespace, key)
    assert await kv.keys(b"", b"") == [b"@namespace_:weird", b"@namespace_nocolon", b"plain"]
    assert await kv.keys(b"a%b", b"") == [b"k"]
    assert len(await store.get_all(TABLE_KV)) == len(OLD_ROWS)
    assert await store.get(TABLE_META, META_CLUSTER_ID) == CLUSTER_ID
    assert await store.get(TABLE_META, META_SESSION_NAME) == b"session_old"


async def _assert_server_keeps_identity(store: Store) -> None:
    server = GcsServer(fast_config(), store=store)
    await server.start()
    try:
        assert server.meta is not None
        assert server.meta.cluster_id == CLUSTER_ID and not server.meta.created
        assert server.meta.session_name == "session_old"
    finally:
        await server.stop()


@pytest.fixture(params=("sqlite", "postgres"))
def fresh_sql_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database(f"old{uuid.uuid4().hex[:10]}")


async def _write_old_sql(url: str, namespace: str) -> None:
    """A database at revision 0001 holding OLD_ROWS, as the old code wrote them."""
    engine = create_async_engine(normalize_sql_url(url))
    try:
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: migrate.upgrade_connection(sync, "0001"))
            await conn.execute(
                KV.insert(),
                [
                    {"namespace": namespace, "table_name": TABLE_KV, "key": k, "value": v}
                    for k, v in OLD_ROWS.items()
                ],
            )
    finally:
        await engine.dispose()


class TestSqlMigration:
    async def test_old_layout_is_migrated_once_and_reads_the_same(self, fresh_sql_url: str) -> None:
        await _write_old_sql(fresh_sql_url, "default")
        for _ in range(2):  # the second open must find nothing to do
            async with SqlStore(fresh_sql_url) as store:
                assert await store.schema_revision() == migrate.head_revision()
                await _assert_same_contents(store)
        store = SqlStore(fresh_sql_url)
        await store.open()
        try:
            await _assert_server_keeps_identity(store)
        finally:
            await store.close()


class TestRedisMigration:
    async def test_old_layout_is_migrated_once_and_reads_the_same(
        self, redis_server: RedisServer
    ) -> None:
        namespace = f"old{uuid.uuid4().hex[:10]}"
        raw = Redis.from_url(redis_server.url)
        try:
            await raw.hset(f"RAY{namespace}@KV", mapping=OLD_ROWS)  # type: ignore[misc]
        finally:
            await raw.aclose()
        for _ in range(2):
            async with RedisStore(redis_server.url, namespace=namespace) as store:
                await _assert_same_contents(store)
        async with RedisStore(redis_server.url, namespace=namespace) as store:
            await _assert_server_keeps_identity(store)


class TestNewLayoutIsStable:
    """A store created in the new layout is never "migrated" again (that would re-escape)."""

    @pytest.mark.parametrize("kind", ["sqlite", "redis"])
    async def test_reopen_keeps_new_layout_keys(
        self, kind: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
    ) -> None:
        make: Callable[[], Store]
        if kind == "sqlite":
            url = f"sqlite:///{tmp_path / 'new.db'}"
            make = lambda: SqlStore(url)  # noqa: E731
        else:
            redis: RedisServer = request.getfixturevalue("redis_server")
            namespace = f"new{uuid.uuid4().hex[:10]}"
            make = lambda: RedisStore(redis.url, namespace=namespace)  # noqa: E731
        async with make() as store:
            kv = KvManager(store)
            await kv.put(b"", b"x", b"1", overwrite=False)
            await kv.put(b"a%b:c", b"y", b"2", overwrite=False)
        for _ in range(2):
            async with make() as store:
                kv = KvManager(store)
                assert await kv.get(b"", b"x") == b"1"
                assert await kv.get(b"a%b:c", b"y") == b"2"
                assert len(await store.get_all(TABLE_KV)) == 2
