"""Pick a backend from a URL: memory://, sqlite:///path, postgresql+asyncpg://..., redis://...,
redis+sentinel://..."""

from __future__ import annotations

from gcs.store.base import Store
from gcs.store.redis_options import RedisOptions

REDIS_SCHEMES = frozenset({"redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel"})


def store_from_url(
    url: str,
    *,
    namespace: str = "default",
    redis: RedisOptions | None = None,
    ha: bool = False,
) -> Store:
    """Build (not open) the store for ``url``.

    ``namespace`` separates clusters that share one backend; ``redis`` tunes a Redis store
    (credentials, replica acknowledgements); ``ha`` (``gcs serve --ha``) makes a Redis or
    SQL store fence its writes and feed the change stream, and a memory store keep one
    (``gcs.store.ha``; refusing ``--ha`` on memory / SQLite is the server's call).
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        from gcs.store.memory import MemoryStore

        return MemoryStore(url, ha=ha)
    if scheme in REDIS_SCHEMES:
        from gcs.store.redis import RedisStore

        return RedisStore(url, namespace=namespace, options=redis or RedisOptions.default, ha=ha)
    if scheme.startswith(("sqlite", "postgresql", "postgres")):
        from gcs.store.sql import SqlStore

        return SqlStore(url, namespace=namespace, ha=ha)
    raise ValueError(
        f"storage URL {url!r}: unsupported scheme; use memory://, sqlite:///PATH, "
        "postgresql+asyncpg://USER@HOST/DB, redis://HOST:PORT/DB or "
        "redis+sentinel://HOST:PORT,HOST:PORT/MASTER/DB"
    )


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
