"""Store fixtures: private Redis / PostgreSQL servers and one handle per backend under test.

* ``redis_server`` / ``postgres_server`` (session): private servers on free ports;
  ``sentinel_deployment`` (master, replica, three sentinels) and ``cluster_deployment``
  (three masters with a replica each) likewise, for the contract suite (tests that kill a
  node start their own).
* ``backend`` (one parameter per test instance of every row of the store registry,
  ``gcs.store.registry.STORES``: memory / sqlite / postgres / redis / redis_sentinel /
  redis_cluster; a module with its own ``REGISTRY`` runs over that instead) and
  ``durable_backend`` (the durable ones): a :class:`Backend` whose
  ``open(namespace=None)`` builds and
  opens a store on a fresh per-test namespace (SQLite: a per-test file); reopening with the
  same namespace sees the same data.  Stores are closed at teardown.
* ``store``: ``await backend.open()``.
* ``ha_backend`` (the same six, from the registry with ``HA_HOOKS``; ``gcs.store.ha``): an
  :class:`HaBackend` whose ``open()``
  gives another HA store *handle* on one namespace (another process's store object; memory:
  ``MemoryStore.handle()`` over one shared store on a ``FakeClock``), and whose
  ``expire_lease()`` makes the live lease lapse on the store's own clock (memory: the fake
  clock moves; Redis: the lease key goes, as PEXPIRE would make it; SQL: its expiry is set
  in the past), so no test waits for a TTL.
* ``outage_backend`` (sqlite / postgres / redis): a Backend with ``break_()`` / ``repair()``
  that really takes the backend away (Redis: its own server is stopped and started on the same
  port; PostgreSQL: the session server is stopped and started; SQLite: another connection
  holds the write lock past the busy timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import pytest

from gcs.store.base import Store
from gcs.store.memory import MemoryStore
from gcs.store.redis.ha import HaKeys
from gcs.store.redis.store import RedisOptions, RedisStore
from gcs.store.registry import STORES, Registry, StoreKind, TestInstance
from gcs.store.settings import StoreSettings
from gcs.store.sql.store import SqlOptions, SqlStore
from gcs.testing.postgres import PostgresServer
from gcs.testing.redis_cluster import RedisCluster, redis_cluster
from gcs.testing.redis_sentinels import RedisSentinels, redis_sentinels
from gcs.testing.redis_server import RedisServer
from tests.autoscaler.clock import SteppedClock

OUTAGE_BACKENDS = ("sqlite", "postgres", "redis")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    yield server
    server.cleanup()


# Shared deployments never fail over on purpose: detection times long enough that a loaded
# machine (an fsync stalling Redis) does not make one happen by accident mid-test.


@pytest.fixture(scope="session")
def sentinel_deployment() -> Iterator[RedisSentinels]:
    with redis_sentinels(down_after_ms=10_000, failover_timeout_ms=20_000) as deployment:
        yield deployment


@pytest.fixture(scope="session")
def cluster_deployment() -> Iterator[RedisCluster]:
    with redis_cluster(node_timeout_ms=10_000) as deployment:
        yield deployment


@dataclass
class Backend:
    """A backend under test: builds stores for one test and closes them afterwards."""

    name: str
    make: Callable[[str], Store]
    namespace: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:12]}")
    opened: list[Store] = field(default_factory=list)
    break_: Callable[[], None] = lambda: None
    repair: Callable[[], None] = lambda: None

    async def open(self, namespace: str | None = None) -> Store:
        store = self.make(namespace or self.namespace)
        await store.open()
        self.opened.append(store)
        return store

    async def close_all(self) -> None:
        for store in self.opened:
            await store.close()


def registry_of(module: object) -> Registry:
    """The registry a test module's contract tests run over: its own ``REGISTRY`` (a toy's
    module) or the store registry."""
    registry = getattr(module, "REGISTRY", STORES)
    assert isinstance(registry, Registry)
    return registry


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``backend`` / ``durable_backend``: one parameter per test instance of every row of
    the registry (:class:`gcs.store.registry.TestInstance`), nothing listed here."""
    instances = registry_of(metafunc.module).test_instances()
    for name, durable_only in (("backend", False), ("durable_backend", True)):
        if name in metafunc.fixturenames:
            chosen = [(k, t) for k, t in instances if t.durable or not durable_only]
            ids = [t.name for _, t in chosen]
            metafunc.parametrize(name, chosen, ids=ids, indirect=True)
    if "ha_backend" in metafunc.fixturenames:
        chosen = ha_instances(registry_of(metafunc.module))
        metafunc.parametrize("ha_backend", chosen, ids=[t.name for _, t in chosen], indirect=True)


def make_backend(
    kind: StoreKind, test: TestInstance, request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> Backend:
    """A handle on a store of ``kind`` built as its row's ``test`` instance says."""
    server = request.getfixturevalue(test.server) if test.server is not None else None
    url = test.url(server, tmp_path)
    return Backend(test.name, lambda ns: kind.build(url, StoreSettings(namespace=ns)))


@pytest.fixture
async def backend(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> AsyncIterator[Backend]:
    handle = make_backend(*request.param, request, tmp_path)
    yield handle
    await handle.close_all()


@pytest.fixture
async def durable_backend(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> AsyncIterator[Backend]:
    handle = make_backend(*request.param, request, tmp_path)
    yield handle
    await handle.close_all()


@pytest.fixture
async def store(backend: Backend) -> Store:
    return await backend.open()


AnyHaStore = MemoryStore | RedisStore | SqlStore
"""A store implementing both Store and HaStore (the tests use both sides)."""


@dataclass
class HaBackend:
    """An HA backend under test: store handles on one namespace, and store-side expiry.

    ``changes_bound`` (first open of a namespace for memory; per handle elsewhere) bounds
    the change stream, for trimming tests."""

    name: str
    make: Callable[[str, int | None], AnyHaStore]
    expire: Callable[[AnyHaStore], Awaitable[None]]
    clock: SteppedClock | None = None
    namespace: str = field(default_factory=lambda: f"h{uuid.uuid4().hex[:12]}")
    opened: list[AnyHaStore] = field(default_factory=list)

    async def open(
        self, *, namespace: str | None = None, changes_bound: int | None = None
    ) -> AnyHaStore:
        store = self.make(namespace or self.namespace, changes_bound)
        await store.open()
        self.opened.append(store)
        return store

    async def expire_lease(self, store: AnyHaStore) -> None:
        """The live lease of ``store``'s namespace lapses now (on the store's clock)."""
        await self.expire(store)

    async def close_all(self) -> None:
        for store in self.opened:
            await store.close()


def _memory_ha(clock: SteppedClock) -> Callable[[str, int | None], AnyHaStore]:
    roots: dict[str, MemoryStore] = {}

    def make(namespace: str, bound: int | None) -> AnyHaStore:
        root = roots.get(namespace)
        if root is None:
            root = roots[namespace] = MemoryStore(clock=clock, max_changes=bound or 100_000)
            return root
        return root.handle()

    return make


async def _expire_redis_lease(store: AnyHaStore) -> None:
    assert isinstance(store, RedisStore) and store.topology is not None
    topology = store.topology
    await topology.client.delete(HaKeys.of(topology.key_prefix(store.namespace)).lease)


def _expire_sql_lease(url: str) -> Callable[[AnyHaStore], Awaitable[None]]:
    async def expire(store: AnyHaStore) -> None:
        assert isinstance(store, SqlStore)
        if url.startswith("sqlite"):
            # in a thread: a write transaction of ours may be waiting on this loop to commit
            await asyncio.to_thread(_expire_sqlite_lease, url.removeprefix("sqlite:///"), store)
            return
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "UPDATE gcs_lease SET expires_ms = 0 WHERE namespace = $1", store.namespace
            )
        finally:
            await conn.close()

    return expire


def _expire_sqlite_lease(path: str, store: SqlStore) -> None:
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as raw, raw:
        raw.execute("UPDATE gcs_lease SET expires_ms = 0 WHERE namespace = ?", (store.namespace,))


def _memory_ha_backend(name: str, _url: str) -> HaBackend:
    clock = SteppedClock()
    return HaBackend(name, _memory_ha(clock), lambda _s: _advance(clock), clock=clock)


def _sql_ha_backend(name: str, url: str) -> HaBackend:
    def make_sql(namespace: str, bound: int | None) -> AnyHaStore:
        options = SqlOptions()
        if bound is not None:
            options = SqlOptions(changes_max_entries=bound, changes_trim_every=1)
        return SqlStore(url, namespace=namespace, options=options, ha=True)

    return HaBackend(name, make_sql, _expire_sql_lease(url))


def _redis_ha_backend(name: str, url: str) -> HaBackend:
    def make_redis(namespace: str, bound: int | None) -> AnyHaStore:
        options = RedisOptions(changes_max_entries=bound or 100_000)
        return RedisStore(url, namespace=namespace, options=options, ha=True)

    return HaBackend(name, make_redis, _expire_redis_lease)


HA_HOOKS: dict[str, Callable[[str, str], HaBackend]] = {
    "memory": _memory_ha_backend,
    "sqlite": _sql_ha_backend,
    "postgresql": _sql_ha_backend,
    "redis": _redis_ha_backend,
}
"""Per registry row (``gcs.store.registry``): what the HA suite needs beyond the row --
handles with a bounded change stream, and making the live lease lapse now.  The HA suite
runs on every row that says ``ha`` (a row without a hook here fails, naming it) and on the
rows here that take ``--ha`` only in tests (memory, SQLite)."""


def ha_instances(registry: Registry) -> list[tuple[StoreKind, TestInstance]]:
    return [(k, t) for k, t in registry.test_instances() if k.ha or k.name in HA_HOOKS]


def make_ha_backend(
    kind: StoreKind, test: TestInstance, request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> HaBackend:
    hook = HA_HOOKS.get(kind.name)
    if hook is None:
        pytest.fail(f"store kind {kind.name!r} takes --ha: add its HA_HOOKS row (tests/store)")
    server = request.getfixturevalue(test.server) if test.server is not None else None
    return hook(test.name, test.url(server, tmp_path))


async def _advance(clock: SteppedClock) -> None:
    clock.advance(3600.0)


@pytest.fixture
async def ha_backend(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> AsyncIterator[HaBackend]:
    handle = make_ha_backend(*request.param, request, tmp_path)
    yield handle
    await handle.close_all()


class _SqliteLockHolder:
    """Another connection that holds SQLite's write lock, as a second writer process would."""

    def __init__(self, path: pathlib.Path) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None

    def hold(self) -> None:
        self._conn = sqlite3.connect(self._path, isolation_level=None)
        self._conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        if self._conn is not None:
            self._conn.execute("ROLLBACK")
            self._conn.close()
            self._conn = None


@pytest.fixture(params=OUTAGE_BACKENDS)
async def outage_backend(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> AsyncIterator[Backend]:
    name = request.param
    if name == "sqlite":
        path = tmp_path / "store.db"
        holder = _SqliteLockHolder(path)
        options = SqlOptions(busy_timeout_s=0.2)
        handle = Backend(
            name,
            lambda ns: SqlStore(f"sqlite:///{path}", namespace=ns, options=options),
            break_=holder.hold,
            repair=holder.release,
        )
        yield handle
        await handle.close_all()
        holder.release()
    elif name == "postgres":
        pg: PostgresServer = request.getfixturevalue("postgres_server")
        options = SqlOptions(connect_timeout_s=1.0, command_timeout_s=2.0)
        handle = Backend(
            name,
            lambda ns: SqlStore(pg.url(), namespace=ns, options=options),
            break_=pg.stop,
            repair=pg.start,
        )
        yield handle
        await handle.close_all()
        pg.start()  # leave the session server running even if the test failed midway
    else:
        redis = RedisServer().start()
        options = RedisOptions(socket_timeout_s=1.0, connect_timeout_s=0.5)
        handle = Backend(
            name,
            lambda ns: RedisStore(redis.url, namespace=ns, options=options),
            break_=redis.stop,
            repair=redis.start,
        )
        yield handle
        await handle.close_all()
        redis.cleanup()
