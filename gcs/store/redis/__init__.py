"""The Redis backend (``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``).

Modules, each importing only those above it in this list: ``options`` (tuning),
``scripts`` (the Lua), ``ha`` (HA keys and replies), ``topology`` (the master of a
deployment: the interface and a standalone server), ``sentinel`` and ``cluster`` (the
other deployments), ``connect`` (URL -> topology), ``runner`` (one script with retries,
WAIT and "maybe sent"), ``store`` (:class:`~gcs.store.redis.store.RedisStore`).

Nothing here is imported by the package itself: a GCS on SQL never imports redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gcs.store.base import Store
    from gcs.store.settings import StoreSettings

__all__ = ["build", "ray_redis_url"]


def build(url: str, settings: StoreSettings) -> Store:
    """The registry's factory (:mod:`gcs.store.registry`); imports redis-py on first use."""
    from gcs.store.redis.store import RedisStore

    return RedisStore(
        url,
        namespace=settings.namespace,
        options=settings.redis,
        ha=settings.ha,
        clock=settings.clock,
    )


def ray_redis_url(_storage_path: str) -> str:
    """Ray names its Redis by flags (``--redis_address``), never by ``gcs_storage`` alone."""
    raise ValueError("gcs_storage=redis needs --redis_address / --redis_port")
