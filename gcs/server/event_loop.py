"""The event loop ``gcs serve`` runs on (the ``event_loop`` setting).

uvloop (libuv's loop) does the same asyncio work with less CPU per call: its transports,
timers and callbacks are C, where the standard library's selector loop is Python.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable

from gcs.config import ConfigError

__all__ = ["loop_factory"]


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """For ``asyncio.Runner(loop_factory=...)``: None for ``asyncio`` (the standard loop),
    uvloop's constructor for ``uvloop`` (a :class:`ConfigError` when it is not installed)."""
    if name == "asyncio":
        return None
    if name == "uvloop":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError:
            raise ConfigError(
                "event_loop (GCS_EVENT_LOOP): uvloop is not installed (pip install uvloop), "
                "or set it to asyncio"
            ) from None
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    raise ConfigError(f"event_loop (GCS_EVENT_LOOP): {name!r} is not one of asyncio, uvloop")
