"""A store waits on the clock it was given (the server's), never on wall time: a test
moves a fake clock and the wait is over (the rule over the source: test_layout.py)."""

from __future__ import annotations

import asyncio
import pathlib

from gcs.base.clock import FakeClock
from gcs.store import WriteBatch
from gcs.store.factory import store_from_url
from gcs.store.sql.options import SqlOptions
from gcs.store.sql.store import SqlStore


class TestStoresWaitOnTheirClock:
    async def test_a_blocked_sql_change_read_ends_when_the_store_clock_passes_its_wait(
        self, tmp_path: pathlib.Path
    ) -> None:
        """An hour's blocking read on SQLite (which polls) returns empty once the fake clock
        moved an hour, in a moment of wall time."""
        clock = FakeClock()
        options = SqlOptions(changes_poll_interval_s=60.0)
        store = SqlStore(f"sqlite:///{tmp_path / 'c.db'}", ha=True, clock=clock, options=options)
        await store.open()
        try:
            cursor = await store.change_cursor()
            reader = asyncio.create_task(store.read_changes(cursor, block_ms=3_600_000))
            await clock.advance_until(reader.done, step_s=60.0, timeout_s=30.0)
            assert reader.result() == (cursor, [])
            assert clock.monotonic_s() - 1000.0 >= 3600.0
        finally:
            await store.close()

    async def test_the_registry_hands_the_clock_to_the_store(self, tmp_path: pathlib.Path) -> None:
        """``store_from_url(clock=...)`` reaches the backend: a blocked read ends on it."""
        clock = FakeClock()
        url = f"sqlite:///{tmp_path / 'r.db'}"
        store = store_from_url(url, ha=True, clock=clock)
        assert isinstance(store, SqlStore)
        await store.open()
        try:
            await store.write(WriteBatch().put("KV", b"k", b"v"))
            cursor = await store.change_cursor()
            reader = asyncio.create_task(store.read_changes(cursor, block_ms=600_000))
            await clock.advance_until(reader.done, step_s=10.0, timeout_s=30.0)
            assert reader.result() == (cursor, [])
        finally:
            await store.close()
