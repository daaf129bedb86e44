"""Building the configured store (from the registry, on the server's clock) and opening it
at start within Ray's retry budget, for a term's wiring and an HA member alike
(``redis_db_connect_retries`` x ``redis_db_connect_wait_milliseconds``)."""

from __future__ import annotations

from gcs.base.clock import Clock
from gcs.config import GcsConfig
from gcs.store import Store
from gcs.store.factory import open_with_retry, store_from_url


def build_configured(cfg: GcsConfig, clock: Clock) -> Store:
    """The store ``cfg`` names, built (not opened); its waits run on ``clock``."""
    return store_from_url(
        cfg.storage_url(),
        namespace=cfg.namespace,
        redis=cfg.redis.options(),
        ha=cfg.ha.enabled,
        clock=clock,
    )


async def open_configured(store: Store, clock: Clock, cfg: GcsConfig) -> None:
    """Open ``store`` within Ray's retry budget (``redis_db_connect_retries`` x
    ``redis_db_connect_wait_milliseconds``), for a term's wiring and an HA member alike."""
    await open_with_retry(
        store,
        clock,
        retries=cfg.redis_db_connect_retries,
        wait_ms=cfg.redis_db_connect_wait_milliseconds,
    )
