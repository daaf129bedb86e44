"""Pick a backend from a URL: memory://, sqlite:///path, postgresql+asyncpg://..., redis://..."""

from __future__ import annotations

from gcs.store.base import Store


def store_from_url(url: str, *, namespace: str = "default") -> Store:
    """Build (not open) the store for ``url``.

    ``namespace`` separates clusters that share one backend.
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        from gcs.store.memory import MemoryStore

        return MemoryStore(url)
    if scheme in {"redis", "rediss", "unix"}:
        from gcs.store.redis import RedisStore

        return RedisStore(url, namespace=namespace)
    if scheme.startswith(("sqlite", "postgresql", "postgres")):
        from gcs.store.sql import SqlStore

        return SqlStore(url, namespace=namespace)
    raise ValueError(
        f"storage URL {url!r}: unsupported scheme; use memory://, sqlite:///PATH, "
        "postgresql+asyncpg://USER@HOST/DB or redis://HOST:PORT/DB"
    )


async def open_store(url: str, *, namespace: str = "default") -> Store:
    store = store_from_url(url, namespace=namespace)
    await store.open()
    return store
