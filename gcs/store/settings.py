"""What a backend's factory gets beyond the URL (:class:`StoreSettings`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gcs.base.clock import Clock
from gcs.store.base import Store
from gcs.store.redis.options import RedisOptions

__all__ = ["StoreFactory", "StoreSettings"]


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """What a backend may need beyond its URL."""

    namespace: str = "default"
    """Separates clusters that share one backend."""
    redis: RedisOptions = field(default_factory=lambda: RedisOptions.default)
    """Credentials and replica acknowledgements for a Redis store."""
    ha: bool = False
    """``gcs serve --ha``: fence writes and keep the change stream (:mod:`gcs.store.ha`)."""
    clock: Clock | None = None
    """What the store's waits run on (retries, blocked reads); the server passes its own,
    None is the system clock."""


StoreFactory = Callable[[str, StoreSettings], Store]
"""(url, settings) -> the store, built, not opened."""
