"""Adding a store is one file and one registry row: the toy (``tests/store/toy_store.py``,
dict-backed, ``toy://``) runs the whole contract suite from its row alone, and the registry
refuses a store that does not implement the contract.

The contract's test classes are collected here a second time over this module's own
``REGISTRY`` (``tests/store/conftest.py`` parametrizes ``backend`` from a module's
``REGISTRY`` when it has one, else from ``gcs.store.registry.STORES``)."""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import pytest

from gcs.config import check_ha, storage_scheme_ok
from gcs.store.base import Store
from gcs.store.factory import store_from_url
from gcs.store.registry import STORES, Registry, StoreKind, TestInstance
from gcs.store.settings import StoreSettings
from tests.conftest import fast_config
from tests.store.conftest import registry_of
from tests.store.test_contract import (
    TestBatches,
    TestCounters,
    TestDurability,
    TestNamespaces,
    TestReadsAndWrites,
)
from tests.store.toy_store import TOY, ToyStore

REGISTRY = Registry((TOY,))
"""What this module's contract tests run over: the toy's row and nothing else."""

__all__ = [  # collected here too, over REGISTRY
    "TestBatches",
    "TestCounters",
    "TestDurability",
    "TestNamespaces",
    "TestReadsAndWrites",
]


class TestTheRegistryDrivesTheSuite:
    def test_the_contract_suite_runs_over_every_test_instance_of_every_row(self) -> None:
        """The store registry's rows are the contract suite's parameters; here, the toy's."""
        names = [test.name for _, test in STORES.test_instances()]
        assert names == [
            "memory",
            "sqlite",
            "postgres",
            "redis",
            "redis_sentinel",
            "redis_cluster",
        ]
        here = registry_of(sys.modules[__name__]).test_instances()
        assert [test.name for _, test in here] == ["toy"]

    def test_a_row_registered_in_the_store_registry_serves_every_reader_of_it(self) -> None:
        """URLs with the toy's scheme build a toy; the configuration accepts the scheme,
        and refuses --ha on it because its row says it cannot be shared."""
        assert not storage_scheme_ok("toy://x")
        with STORES.registered(TOY):
            assert storage_scheme_ok("toy://x")
            store = store_from_url("toy://x", namespace="n")
            assert isinstance(store, ToyStore) and store.namespace == "n"
            config = fast_config(storage="toy://x")
            config = dataclasses.replace(config, ha=dataclasses.replace(config.ha, enabled=True))
            with pytest.raises(Exception, match="--ha needs a store other GCS processes share"):
                check_ha(config)
        assert not storage_scheme_ok("toy://x")

    @pytest.mark.parametrize("kind", STORES.kinds(), ids=[kind.name for kind in STORES.kinds()])
    def test_ha_is_allowed_exactly_where_the_row_says(self, kind: StoreKind) -> None:
        """``--ha`` is accepted on a row's schemes iff the row says ``ha`` (no second list)."""
        for scheme in kind.schemes:
            config = fast_config(storage=f"{scheme}://host/db")
            config = dataclasses.replace(config, ha=dataclasses.replace(config.ha, enabled=True))
            if kind.ha:
                check_ha(config)
            else:
                with pytest.raises(Exception, match="--ha needs a store"):
                    check_ha(config)

    def test_the_drop_in_maps_rays_gcs_storage_through_the_rows(self) -> None:
        """Ray's ``gcs_storage`` values are the rows' ``ray_storage``: a row standing in for
        one is what the drop-in builds its URL with, and the refusal lists every row's."""
        from gcs.cli.dropin.flags import GcsServerFlags
        from gcs.cli.dropin.ray_config import RayConfigError, storage_url

        flags = GcsServerFlags()
        row = dataclasses.replace(TOY, ray_storage="toydb", ray_url=lambda path: f"toy://{path}")
        with pytest.raises(RayConfigError, match="not one of memory, redis, rocksdb "):
            storage_url(flags, {"gcs_storage": "toydb"}, {})
        with STORES.registered(row):
            knobs = {"gcs_storage": "toydb", "gcs_storage_path": "shelf"}
            assert storage_url(flags, knobs, {}) == "toy://shelf"
            with pytest.raises(RayConfigError, match="not one of memory, redis, rocksdb, toydb "):
                storage_url(flags, {"gcs_storage": "nope"}, {})
        assert storage_url(flags, {"gcs_storage": "memory"}, {}) == "memory://"

    def test_every_built_in_row_builds_a_store_without_io(self, tmp_path: pathlib.Path) -> None:
        """Each row's factory gives a Store (an HaStore where the row says ha), unopened."""
        from gcs.store.ha import HaStore

        for kind in STORES.kinds():
            url = f"{kind.schemes[0]}:///{tmp_path / 'x.db'}"
            store = kind.build(url, StoreSettings(ha=kind.ha))
            assert isinstance(store, Store)
            assert isinstance(store, HaStore) or not kind.ha


class _NoCounters(Store):
    """A store that forgot the counters."""

    def __init__(self, url: str, settings: StoreSettings) -> None:
        self.url = url

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def get(self, table: str, key: bytes) -> bytes | None: ...
    async def multi_get(self, table: str, keys: object) -> dict[bytes, bytes]: ...  # type: ignore[override]
    async def get_all(self, table: str) -> dict[bytes, bytes]: ...  # type: ignore[empty-body]
    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]: ...  # type: ignore[empty-body]
    async def write(self, batch: object) -> None: ...  # type: ignore[override]


class TestRegistrationRefusesABrokenRow:
    def test_a_store_missing_a_method_is_refused_naming_it(self) -> None:
        """Registration checks a store class against the contract, before any URL."""
        row = StoreKind("broken", ("broken",), _NoCounters, ha=False)  # type: ignore[arg-type]
        with pytest.raises(
            TypeError, match="_NoCounters does not implement increment, read_counter"
        ):
            Registry().register(row)

    def test_a_row_claiming_ha_needs_an_ha_store(self) -> None:
        """``ha=True`` on a store without the lease and change stream is refused."""
        row = dataclasses.replace(TOY, ha=True)
        with pytest.raises(TypeError, match="ToyStore is not a HaStore"):
            Registry().register(row)

    def test_a_scheme_has_one_owner(self) -> None:
        """A second row for a registered scheme is refused, naming the owner."""
        twin = dataclasses.replace(TOY, name="twin")
        with pytest.raises(ValueError, match="scheme 'toy' belongs to 'toy'"):
            Registry((TOY,)).register(twin)


class _ForgetfulToy(ToyStore):
    """Breaks the contract: a prefix scan returns the whole table."""

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        return await self.get_all(table)


async def test_a_toy_that_breaks_the_contract_fails_the_suite(tmp_path: pathlib.Path) -> None:
    """The suite's test, run on a store that ignores the prefix, fails."""
    row = StoreKind(
        "forgetful",
        ("forgetful",),
        _ForgetfulToy,
        ha=False,
        tests=(TestInstance("forgetful", lambda _s, f: f"forgetful://{f.name}"),),
    )
    store = Registry((row,)).kinds()[0].build(f"forgetful://{tmp_path.name}", StoreSettings())
    await store.open()
    with pytest.raises(AssertionError):
        await TestReadsAndWrites().test_scan_prefix_matches_bytewise_prefixes(store, b"a")
