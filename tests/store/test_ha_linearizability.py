"""InternalKV histories recorded while two GCS store handles fight over the lease are
linearizable: the loser's writes are refused (StoreFenced: nothing written), never half
applied, never applied late (``gcs.testing.linearizability``)."""

from __future__ import annotations

import asyncio
import random

from gcs.managers.kv import KvManager
from gcs.store import StoreUnavailable
from gcs.store.ha import StoreFenced
from gcs.testing.linearizability import (
    History,
    Workload,
    check,
    inject_lost_write,
    inject_second_winner,
    inject_stale_read,
)
from gcs.testing.stores import YieldingStore
from tests.store.conftest import AnyHaStore, HaBackend

TTL_MS = 60_000
ROUNDS = 6
"""Takeovers per history (the lease changes hands this many times)."""
OPS_PER_ROUND = 40


def _definite(err: BaseException) -> bool:
    """Errors that mean nothing was written (left out of the history)."""
    return isinstance(err, StoreFenced | StoreUnavailable)


class _TwoGcs:
    """InternalKV as clients see it with two GCS processes on one store: every call goes
    to one of them at random (a client that has not noticed the takeover yet, or has)."""

    def __init__(self, a: KvManager, b: KvManager, seed: int) -> None:
        self._gcs = (a, b)
        self._rng = random.Random(seed)
        self.done = 0
        self.progress = asyncio.Event()

    def _pick(self) -> KvManager:
        return self._gcs[self._rng.randrange(2)]

    def _count(self) -> None:
        self.done += 1
        self.progress.set()

    async def put(self, namespace: bytes, key: bytes, value: bytes, *, overwrite: bool) -> bool:
        try:
            return await self._pick().put(namespace, key, value, overwrite=overwrite)
        finally:
            self._count()

    async def get(self, namespace: bytes, key: bytes) -> bytes | None:
        try:
            return await self._pick().get(namespace, key)
        finally:
            self._count()

    async def delete(self, namespace: bytes, key: bytes, *, by_prefix: bool) -> int:
        try:
            return await self._pick().delete(namespace, key, by_prefix=by_prefix)
        finally:
            self._count()


async def _fight(backend: HaBackend, seed: int) -> tuple[History, int]:
    """Record a history while the lease changes hands ROUNDS times; the history and the
    number of writes refused by the fence."""
    stores: list[AnyHaStore] = [await backend.open(), await backend.open()]
    kv = _TwoGcs(*(KvManager(YieldingStore(s)) for s in stores), seed=seed)
    history = History()
    refused = 0
    finished = False

    async def count_refusals(err: BaseException) -> None:
        nonlocal refused
        refused += isinstance(err, StoreFenced)

    async def take_turns() -> None:
        nonlocal finished
        for turn in range(ROUNDS):
            store = stores[turn % 2]
            await backend.expire_lease(store)
            epoch = await store.try_acquire_lease(f"gcs-{turn % 2}", TTL_MS)
            assert epoch is not None
            store.fence(epoch)
            target = kv.done + OPS_PER_ROUND
            while kv.done < target:
                kv.progress.clear()
                await kv.progress.wait()
        finished = True

    workload = Workload(clients=6, keys=4, delete_keys=1, seed=seed)
    await asyncio.gather(
        workload.run(
            kv, history, stop=lambda: finished, failed_if=_definite, on_error=count_refusals
        ),
        take_turns(),
    )
    await workload.read_back(kv, history, failed_if=_definite)
    return history, refused


class TestLeaseFight:
    async def test_histories_of_two_handles_fighting_over_the_lease_are_linearizable(
        self, ha_backend: HaBackend
    ) -> None:
        """Six takeovers under six InternalKV clients: the loser's writes are refused and
        what clients saw is linearizable."""
        history, refused = await _fight(ha_backend, seed=3)
        assert refused > 0
        assert history.failed >= refused
        assert len({op.client for op in history.operations}) == 7  # six + the read-back
        result = check(history.operations)
        assert result.ok, str(result)

    async def test_the_check_finds_each_fault_planted_in_such_a_history(
        self, ha_backend: HaBackend
    ) -> None:
        """A stale read, a second put-if-absent winner, a lost write: each is found."""
        history, _ = await _fight(ha_backend, seed=4)
        assert check(history.operations).ok
        for inject in (inject_stale_read, inject_second_winner, inject_lost_write):
            assert not check(inject(history.operations)).ok, inject.__name__
