"""The one table of store backends: a row (:class:`StoreKind`) per kind of store.

A row says which URL schemes name the kind, the factory that builds a store for a URL (no
I/O: it is opened later), whether ``gcs serve --ha`` may run on it (the store keeps a lease
and a change stream that other GCS processes share: :mod:`gcs.store.ha`), which of Ray
2.60's ``gcs_storage`` values it stands in for (the drop-in, :mod:`gcs.cli.dropin.ray_config`),
and how the contract suite gets an instance of it to test (:class:`TestInstance`).

Everything that lists backends reads :data:`STORES`: the URL factory
(:func:`gcs.store.factory.store_from_url`), the configuration's checks (a known scheme,
``--ha`` only where a row allows it), the drop-in's ``gcs_storage`` mapping and the
contract suite (``tests/store/test_contract.py``, one parameter per test instance of every
row).  Adding a backend is one module (a :class:`~gcs.store.Store`) and one row, here or
through :meth:`Registry.register`; a row whose factory is a class is checked when it is
registered (a store missing a method of the contract is refused, naming the methods).
"""

from __future__ import annotations

import contextlib
import inspect
import pathlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gcs.store import memory as memory_backend
from gcs.store import redis as redis_backend
from gcs.store import sql as sql_backend
from gcs.store.base import Store
from gcs.store.ha import HaStore
from gcs.store.settings import StoreFactory, StoreSettings

__all__ = [
    "STORES",
    "Registry",
    "StoreFactory",
    "StoreKind",
    "StoreSettings",
    "TestInstance",
    "scheme_of",
]


@dataclass(frozen=True, slots=True)
class TestInstance:
    """How the contract suite gets a store of one kind to test.

    The suite asks pytest for the fixture named ``server`` (a private server on a free
    port, started once per session; None: the kind needs none), then builds the store from
    ``url(server, folder)``, ``folder`` being a fresh per-test directory."""

    __test__ = False  # a description of a test instance, not a pytest class

    name: str
    """The test parameter's id (``postgres``, ``redis_cluster``...)."""
    url: Callable[[Any, pathlib.Path], str]
    server: str | None = None
    durable: bool = True
    """Reopening the URL on the same namespace sees what was written (memory: no)."""


@dataclass(frozen=True, slots=True)
class StoreKind:
    """One row of the registry."""

    name: str
    schemes: tuple[str, ...]
    """URL schemes, lower case, before any ``+driver`` (``postgresql+asyncpg`` is
    ``postgresql``)."""
    factory: StoreFactory
    ha: bool
    """``gcs serve --ha`` may run on it: its stores implement :class:`HaStore` and other
    GCS processes can reach what they hold."""
    tests: tuple[TestInstance, ...] = ()
    ray_storage: str = ""
    """Ray 2.60's ``gcs_storage`` value this kind stands in for ("" none)."""
    ray_url: Callable[[str], str] | None = None
    """Ray's ``gcs_storage_path`` -> our URL (raises ValueError saying what is missing);
    None: Ray picks this storage by its own flags, not ``gcs_storage``."""

    def build(self, url: str, settings: StoreSettings) -> Store:
        """The store for ``url``, built (not opened)."""
        return self.factory(url, settings)


class Registry:
    """The rows, looked up by name or by a URL's scheme."""

    def __init__(self, kinds: tuple[StoreKind, ...] = ()) -> None:
        self._kinds: dict[str, StoreKind] = {}
        for kind in kinds:
            self.register(kind)

    def register(self, kind: StoreKind) -> StoreKind:
        """Add a row; ValueError / TypeError when it clashes with one or its factory (a
        class) does not implement the contract."""
        if kind.name in self._kinds:
            raise ValueError(f"store kind {kind.name!r} is registered already")
        if not kind.schemes:
            raise ValueError(f"store kind {kind.name!r}: no URL scheme")
        for scheme in kind.schemes:
            if scheme != scheme.lower() or "+" in scheme or "://" in scheme:
                raise ValueError(
                    f"store kind {kind.name!r}: scheme {scheme!r} must be lower case, "
                    "without +driver or ://"
                )
            owner = self.kind_for_scheme(scheme)
            if owner is not None:
                raise ValueError(
                    f"store kind {kind.name!r}: scheme {scheme!r} belongs to {owner.name!r}"
                )
        if inspect.isclass(kind.factory):
            check_store_class(kind.factory, ha=kind.ha, kind=kind.name)
        self._kinds[kind.name] = kind
        return kind

    def unregister(self, name: str) -> None:
        self._kinds.pop(name, None)

    @contextlib.contextmanager
    def registered(self, kind: StoreKind) -> Iterator[StoreKind]:
        """``kind`` registered for the block (tests)."""
        self.register(kind)
        try:
            yield kind
        finally:
            self.unregister(kind.name)

    def kinds(self) -> tuple[StoreKind, ...]:
        return tuple(self._kinds.values())

    def kind_for_scheme(self, scheme: str) -> StoreKind | None:
        for kind in self._kinds.values():
            if scheme in kind.schemes:
                return kind
        return None

    def kind_of(self, url: str) -> StoreKind | None:
        """The row for ``url``'s scheme; None when no row has it."""
        return self.kind_for_scheme(scheme_of(url))

    def for_ray_storage(self, name: str) -> StoreKind | None:
        """The row standing in for Ray's ``gcs_storage`` = ``name``."""
        for kind in self._kinds.values():
            if kind.ray_storage and kind.ray_storage == name:
                return kind
        return None

    def ray_storages(self) -> list[str]:
        return sorted(kind.ray_storage for kind in self._kinds.values() if kind.ray_storage)

    def test_instances(self) -> list[tuple[StoreKind, TestInstance]]:
        """Every (row, test instance): what the contract suite is parametrized over."""
        return [(kind, test) for kind in self._kinds.values() for test in kind.tests]


def check_store_class(cls: type, *, ha: bool, kind: str) -> None:
    """TypeError unless ``cls`` is a complete :class:`Store` (and :class:`HaStore` when the
    row says ``ha``)."""
    wanted: list[type] = [Store, HaStore] if ha else [Store]
    for base in wanted:
        if not issubclass(cls, base):
            raise TypeError(f"store kind {kind!r}: {cls.__name__} is not a {base.__name__}")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise TypeError(
            f"store kind {kind!r}: {cls.__name__} does not implement {', '.join(missing)} "
            "(the Store contract, gcs.store.base)"
        )


def scheme_of(url: str) -> str:
    """``postgresql+asyncpg://...`` -> ``postgresql``; "" without a scheme."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return scheme.split("+", 1)[0]


def _server_url(server: Any, _folder: pathlib.Path) -> str:
    return str(server.url)


STORES = Registry(
    (
        StoreKind(
            name="memory",
            schemes=("memory",),
            factory=memory_backend.build,
            ha=False,  # one process: a second GCS cannot share it
            tests=(TestInstance("memory", lambda _s, _f: "memory://", durable=False),),
            ray_storage="memory",
            ray_url=lambda _path: "memory://",
        ),
        StoreKind(
            name="sqlite",
            schemes=("sqlite",),
            factory=sql_backend.build,
            ha=False,  # one host
            tests=(TestInstance("sqlite", lambda _s, folder: f"sqlite:///{folder / 'store.db'}"),),
            ray_storage="rocksdb",  # Ray's embedded, on-disk storage
            ray_url=sql_backend.ray_rocksdb_url,
        ),
        StoreKind(
            name="postgresql",
            schemes=("postgresql", "postgres"),
            factory=sql_backend.build,
            ha=True,
            tests=(TestInstance("postgres", lambda pg, _f: str(pg.url()), "postgres_server"),),
        ),
        StoreKind(
            name="redis",
            # redis+sentinel:// and rediss+sentinel:// are "redis" / "rediss"
            schemes=("redis", "rediss", "unix"),
            factory=redis_backend.build,
            ha=True,
            tests=(
                TestInstance("redis", _server_url, "redis_server"),
                TestInstance("redis_sentinel", _server_url, "sentinel_deployment"),
                TestInstance("redis_cluster", _server_url, "cluster_deployment"),
            ),
            ray_storage="redis",
            ray_url=redis_backend.ray_redis_url,
        ),
    )
)
"""Every backend.  The factories import their backend on first use: a GCS on Redis never
imports SQLAlchemy."""
