"""Time limits measured on the injected :class:`~gcs.clock.Clock` (``asyncio.wait_for``
measures wall time, which a test cannot move)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from gcs.clock import Clock

__all__ = ["within"]

T = TypeVar("T")


async def within(clock: Clock, seconds: float, awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, or :class:`TimeoutError` once ``seconds`` have passed on
    ``clock`` (the awaitable is then cancelled).  A result ready when the time runs out wins."""
    work = asyncio.ensure_future(awaitable)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        timer.cancel()
        await asyncio.gather(work, timer, return_exceptions=True)
        raise
    timer.cancel()
    await asyncio.gather(timer, return_exceptions=True)
    if work.done():
        return work.result()
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    raise TimeoutError(f"no answer within {seconds:g} s")
