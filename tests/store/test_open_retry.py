"""A store unreachable at start: retried as Ray's GCS retries its Redis, then given up on
with an error that names the store (never "the GCS")."""

from __future__ import annotations

import asyncio

import pytest

from gcs.base.clock import FakeClock
from gcs.cli.support import describe
from gcs.config import load_config
from gcs.store.errors import StoreUnavailable, StoreUnreachable
from gcs.store.factory import open_with_retry, redact_url
from gcs.store.memory import MemoryStore


class DownStore(MemoryStore):
    """A store whose backend answers only from attempt ``up_at`` on (never: 0)."""

    def __init__(self, up_at: int = 0, clock: FakeClock | None = None, takes_s: float = 0) -> None:
        super().__init__("redis://:secret@127.0.0.1:1/0")
        self.attempts = 0
        self._up_at = up_at
        self._clock, self._takes_s = clock, takes_s

    async def open(self) -> None:
        self.attempts += 1
        if self._clock is not None:
            await self._clock.sleep(self._takes_s)  # a client's own retries, a timeout
        if not self._up_at or self.attempts < self._up_at:
            raise StoreUnavailable(f"{redact_url(self.url)}: open failed: Connection refused")


class TestOpenWithRetry:
    async def test_ray_budget_by_default_then_the_last_error(self) -> None:
        """Ray 2.60's redis_db_connect_retries (120) x redis_db_connect_wait_milliseconds
        (500): 121 attempts over exactly 60 s of the clock, then StoreUnavailable."""
        clock, store = FakeClock(), DownStore()
        opening = asyncio.ensure_future(open_with_retry(store, clock))
        await asyncio.sleep(0)  # the first attempt, at once
        assert store.attempts == 1
        started = clock.monotonic_s()
        await clock.advance_until(opening.done, 0.5)
        with pytest.raises(StoreUnreachable) as failed:
            await opening
        assert store.attempts == failed.value.attempts == 121
        assert clock.monotonic_s() - started == pytest.approx(60.0)
        assert failed.value.waited_s == pytest.approx(60.0)
        assert "Connection refused" in str(failed.value)

    async def test_slow_attempts_do_not_stretch_the_budget(self) -> None:
        """Attempts that take 1 s each (the client's own retries): no attempt starts after
        the 60 s, so giving up takes 60 s and one attempt, not 121 x 1.5 s."""
        clock = FakeClock()
        store = DownStore(clock=clock, takes_s=1.0)
        opening = asyncio.ensure_future(open_with_retry(store, clock))
        await asyncio.sleep(0)
        started = clock.monotonic_s()
        await clock.advance_until(opening.done, 0.25)
        with pytest.raises(StoreUnreachable) as failed:
            await opening
        assert 60.0 <= failed.value.waited_s <= 61.0
        assert clock.monotonic_s() - started <= 61.0
        assert failed.value.attempts == store.attempts < 121

    async def test_a_store_that_comes_up_in_time_is_used(self) -> None:
        clock, store = FakeClock(), DownStore(up_at=5)
        opening = asyncio.ensure_future(open_with_retry(store, clock, retries=10, wait_ms=100))
        await clock.advance_until(opening.done, 0.1)
        await opening
        assert store.attempts == 5

    @pytest.mark.parametrize("retries", [0, -1])
    async def test_no_retries_is_one_attempt(self, retries: int) -> None:
        clock, store = FakeClock(), DownStore()
        with pytest.raises(StoreUnavailable):
            await open_with_retry(store, clock, retries=retries, wait_ms=100)
        assert store.attempts == 1


class TestRaysKnobs:
    def test_ray_names_set_the_budget(self) -> None:
        env = {"RAY_redis_db_connect_retries": "4", "RAY_redis_db_connect_wait_milliseconds": "50"}
        config = load_config(env=env)
        assert (config.redis_db_connect_retries, config.redis_db_connect_wait_milliseconds) == (
            4,
            50,
        )
        default = load_config(env={})
        assert default.redis_db_connect_retries == 120
        assert default.redis_db_connect_wait_milliseconds == 500


class TestDescribed:
    def test_an_unreachable_store_is_not_called_the_gcs(self) -> None:
        """The CLI's one sentence for StoreUnavailable names the store, not the GCS."""
        text = describe(
            StoreUnavailable("redis://:***@h:1/0: open failed: refused"), "127.0.0.1:6379"
        )
        assert "GCS" not in text and text.startswith("cannot reach the store")
        assert "***" in text and "secret" not in text


def test_redact_url_hides_only_the_password() -> None:
    assert redact_url("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert redact_url("postgresql+asyncpg://u:p@db/x") == "postgresql+asyncpg://u:***@db/x"
    assert redact_url("sqlite+aiosqlite:///a.db") == "sqlite+aiosqlite:///a.db"
