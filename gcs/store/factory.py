"""Build and open a store from its URL, through the registry (:mod:`gcs.store.registry`).

A factory builds the store without opening it (no I/O), so the wiring can build everything
before anything is loaded; :func:`open_with_retry` opens it within Ray's retry budget.
"""

from __future__ import annotations

import structlog

from gcs.base.clock import Clock
from gcs.store.base import Store
from gcs.store.errors import StoreUnavailable, StoreUnreachable
from gcs.store.redis.options import RedisOptions
from gcs.store.registry import STORES, Registry, scheme_of
from gcs.store.settings import StoreSettings

__all__ = [
    "open_store",
    "open_with_retry",
    "redact_url",
    "scheme_of",
    "store_from_url",
]

log = structlog.get_logger("gcs.store")


def store_from_url(
    url: str,
    *,
    namespace: str = "default",
    redis: RedisOptions | None = None,
    ha: bool = False,
    clock: Clock | None = None,
    registry: Registry = STORES,
) -> Store:
    """Build (not open) the store for ``url``.

    ``namespace`` separates clusters that share one backend; ``redis`` tunes a Redis store
    (credentials, replica acknowledgements); ``ha`` (``gcs serve --ha``) makes a Redis or
    SQL store fence its writes and feed the change stream, and a memory store keep one
    (``gcs.store.ha``; refusing ``--ha`` on memory / SQLite is the configuration's call, from
    the registry's rows); ``clock`` is what the store's waits run on (None: the system's).
    """
    kind = registry.kind_of(url)
    if kind is None:
        raise ValueError(
            f"storage URL {url!r}: unsupported scheme; use memory://, sqlite:///PATH, "
            "postgresql+asyncpg://USER@HOST/DB, redis://HOST:PORT/DB or "
            "redis+sentinel://HOST:PORT,HOST:PORT/MASTER/DB"
        )
    return kind.build(url, StoreSettings(namespace, redis or RedisOptions.default, ha, clock))


async def open_store(
    url: str,
    *,
    namespace: str = "default",
    redis: RedisOptions | None = None,
    ha: bool = False,
    clock: Clock | None = None,
) -> Store:
    store = store_from_url(url, namespace=namespace, redis=redis, ha=ha, clock=clock)
    await store.open()
    return store


DEFAULT_CONNECT_RETRIES = 120
"""Ray 2.60's ``redis_db_connect_retries``: with the wait below, 60 s for a store to come up."""
DEFAULT_CONNECT_WAIT_MS = 500
"""Ray 2.60's ``redis_db_connect_wait_milliseconds``."""
_WARN_EVERY = 10
"""A store still down says so on the first failed attempt, then every this many."""


async def open_with_retry(
    store: Store,
    clock: Clock,
    *,
    retries: int = DEFAULT_CONNECT_RETRIES,
    wait_ms: int = DEFAULT_CONNECT_WAIT_MS,
) -> None:
    """``store.open()``, retried while the backend is unavailable (a GCS started before its
    Redis), as Ray's GCS retries its Redis: at most ``retries`` more attempts, ``wait_ms``
    apart on ``clock`` (Ray's ``redis_db_connect_retries`` /
    ``redis_db_connect_wait_milliseconds``; a negative value acts as 0), and no attempt
    starts after ``retries x wait_ms`` (an attempt itself takes time: a client's own
    retries, a connect timeout), so the budget is the time it says.  Giving up raises
    :class:`StoreUnreachable` (a ``StoreUnavailable``) with what was spent."""
    retries, wait_s = max(retries, 0), max(wait_ms, 0) / 1000
    started = clock.monotonic_s()
    deadline = started + retries * wait_s
    attempt = 0
    while True:
        attempt += 1
        try:
            await store.open()
            return
        except StoreUnavailable as err:
            left_s = deadline - clock.monotonic_s()
            if attempt > retries or left_s <= 0:
                waited_s = clock.monotonic_s() - started
                raise StoreUnreachable(err.message, attempts=attempt, waited_s=waited_s) from err
            if (attempt - 1) % _WARN_EVERY == 0:
                log.warning(
                    "store.unavailable",
                    url=_safe_url(store),
                    attempt=attempt,
                    gives_up_in_s=round(left_s, 1),
                    error=err.message,
                )
            await clock.sleep(min(wait_s, left_s))


def _safe_url(store: Store) -> str:
    """The store's URL for a log line, any password replaced by ``***``."""
    return redact_url(store.url)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for error messages and logs)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
