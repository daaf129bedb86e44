"""Property test: random operation sequences give the same results on a backend as on
MemoryStore (the model), including which batches conflict."""

from __future__ import annotations

import asyncio
import pathlib
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gcs.store import StoreConflict, WriteBatch
from gcs.store.base import Store
from gcs.store.memory import MemoryStore
from gcs.store.redis.store import RedisStore
from gcs.store.sql.store import SqlStore
from gcs.testing.postgres import PostgresServer
from gcs.testing.redis_server import RedisServer

TABLES = ("KV", "NODE")
KEYS = st.sampled_from([b"", b"\x00", b"\xff", b"a", b"a\x00", b"a\xff", b"ab", b"*"])
VALUES = st.sampled_from([b"", b"\x00", b"1", b"\xff\x00"])
TABLE = st.sampled_from(TABLES)


@dataclass(frozen=True)
class Op:
    kind: str
    args: Any


batches = st.builds(
    lambda puts, deletes, conds: Op("batch", (puts, deletes, conds)),
    st.lists(st.tuples(TABLE, KEYS, VALUES), max_size=3),
    st.lists(st.tuples(TABLE, KEYS), max_size=2),
    st.lists(st.tuples(TABLE, KEYS, st.none() | VALUES), max_size=2),
)
increments = st.builds(
    lambda name, by: Op("incr", (name, by)), st.sampled_from(["c1", "c2"]), st.integers(1, 3)
)
scans = st.builds(lambda table, prefix: Op("scan", (table, prefix)), TABLE, KEYS)
OPS = st.lists(st.one_of(batches, increments, scans), min_size=1, max_size=12)


async def _apply(store: Store, op: Op) -> object:
    if op.kind == "incr":
        return await store.increment(*op.args)
    if op.kind == "scan":
        return await store.scan_prefix(*op.args)
    puts, deletes, conds = op.args
    batch = WriteBatch()
    for table, key, value in puts:
        batch.put(table, key, value)
    for table, key in deletes:
        batch.delete(table, key)
    for table, key, expected in conds:
        batch.expect(table, key, expected)
    try:
        await store.write(batch)
    except StoreConflict:
        return "conflict"
    return "ok"


async def _compare(real: Store, ops: list[Op]) -> None:
    model = MemoryStore()
    await real.open()
    try:
        for op in ops:
            assert await _apply(real, op) == await _apply(model, op), op
        for table in TABLES:
            assert await real.get_all(table) == await model.get_all(table)
        for name in ("c1", "c2"):
            assert await real.read_counter(name) == await model.read_counter(name)
    finally:
        await real.close()


@pytest.fixture(scope="module")
def sqlite_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("model") / "model.db"


class TestBackendsMatchTheMemoryModel:
    """Every durable backend behaves like MemoryStore on random batches, conditions,
    counters and prefix scans."""

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ops=OPS)
    def test_sqlite_matches_the_model(self, sqlite_path: pathlib.Path, ops: list[Op]) -> None:
        """SQLite gives the model's results for any operation sequence."""
        store = SqlStore(f"sqlite:///{sqlite_path}", namespace=uuid.uuid4().hex)
        asyncio.run(_compare(store, ops))

    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ops=OPS)
    def test_postgres_matches_the_model(
        self, postgres_server: PostgresServer, ops: list[Op]
    ) -> None:
        """PostgreSQL gives the model's results for any operation sequence."""
        store = SqlStore(postgres_server.url(), namespace=uuid.uuid4().hex)
        asyncio.run(_compare(store, ops))

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ops=OPS)
    def test_redis_matches_the_model(self, redis_server: RedisServer, ops: list[Op]) -> None:
        """Redis gives the model's results for any operation sequence."""
        store = RedisStore(redis_server.url, namespace=uuid.uuid4().hex)
        asyncio.run(_compare(store, ops))
