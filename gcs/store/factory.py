"""Pick a backend from a URL's scheme: one row per backend in :data:`STORES`.

Adding a backend is one module (a :class:`~gcs.store.Store`) and one row here; the
contract suite (``tests/store/test_contract.py``) then names it among its backends.  A
factory builds the store without opening it (no I/O), so the wiring can build everything
before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

from gcs.clock import Clock
from gcs.store.base import Store
from gcs.store.errors import StoreUnavailable
from gcs.store.redis_options import RedisOptions

__all__ = [
    "STORES",
    "StoreFactory",
    "StoreSettings",
    "open_store",
    "open_with_retry",
    "scheme_of",
    "store_from_url",
]

log = structlog.get_logger("gcs.store")


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """What a backend may need beyond its URL."""

    namespace: str = "default"
    """Separates clusters that share one backend."""
    redis: RedisOptions = field(default_factory=lambda: RedisOptions.default)
    """Credentials and replica acknowledgements for a Redis store."""
    ha: bool = False
    """``gcs serve --ha``: fence writes and keep the change stream (:mod:`gcs.store.ha`)."""


StoreFactory = Callable[[str, StoreSettings], Store]
"""(url, settings) -> the store, built, not opened."""


def _memory(url: str, settings: StoreSettings) -> Store:
    from gcs.store.memory import MemoryStore

    return MemoryStore(url, ha=settings.ha)


def _redis(url: str, settings: StoreSettings) -> Store:
    from gcs.store.redis import RedisStore

    return RedisStore(url, namespace=settings.namespace, options=settings.redis, ha=settings.ha)


def _sql(url: str, settings: StoreSettings) -> Store:
    from gcs.store.sql import SqlStore

    return SqlStore(url, namespace=settings.namespace, ha=settings.ha)


STORES: dict[str, StoreFactory] = {
    "memory": _memory,
    "redis": _redis,
    "rediss": _redis,
    "unix": _redis,  # redis+sentinel:// and rediss+sentinel:// are "redis" / "rediss"
    "sqlite": _sql,
    "postgresql": _sql,
    "postgres": _sql,
}
"""URL scheme (before any ``+driver``) -> factory.  Imports are inside the factories: a
GCS on Redis never imports SQLAlchemy."""


def scheme_of(url: str) -> str:
    """``postgresql+asyncpg://...`` -> ``postgresql``; "" without a scheme."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return scheme.split("+", 1)[0]


def store_from_url(
    url: str,
    *,
    namespace: str = "default",
    redis: RedisOptions | None = None,
    ha: bool = False,
    stores: Mapping[str, StoreFactory] = STORES,
) -> Store:
    """Build (not open) the store for ``url``.

    ``namespace`` separates clusters that share one backend; ``redis`` tunes a Redis store
    (credentials, replica acknowledgements); ``ha`` (``gcs serve --ha``) makes a Redis or
    SQL store fence its writes and feed the change stream, and a memory store keep one
    (``gcs.store.ha``; refusing ``--ha`` on memory / SQLite is the server's call).
    """
    factory = stores.get(scheme_of(url))
    if factory is None:
        raise ValueError(
            f"storage URL {url!r}: unsupported scheme; use memory://, sqlite:///PATH, "
            "postgresql+asyncpg://USER@HOST/DB, redis://HOST:PORT/DB or "
            "redis+sentinel://HOST:PORT,HOST:PORT/MASTER/DB"
        )
    return factory(url, StoreSettings(namespace, redis or RedisOptions.default, ha))


async def open_store(
    url: str,
    *,
    namespace: str = "default",
    redis: RedisOptions | None = None,
    ha: bool = False,
) -> Store:
    store = store_from_url(url, namespace=namespace, redis=redis, ha=ha)
    await store.open()
    return store


async def open_with_retry(
    store: Store,
    clock: Clock,
    *,
    attempts: int = 8,
    first_delay_s: float = 0.2,
    max_delay_s: float = 5.0,
) -> None:
    """``store.open()``, retried while the backend is unavailable (a GCS started before its
    Redis), backing off on ``clock``; the last attempt's error is raised."""
    delay = first_delay_s
    for attempt in range(attempts):
        try:
            await store.open()
            return
        except StoreUnavailable as err:
            log.warning("store.unavailable", url=store.url, attempt=attempt, error=err.message)
            await clock.sleep(delay)
            delay = min(delay * 2, max_delay_s)
    await store.open()
