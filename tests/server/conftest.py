from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from tests.server.fake_raylet import FakeRaylet


@pytest.fixture
async def raylets() -> AsyncIterator[Callable[..., object]]:
    started: list[FakeRaylet] = []

    async def make(resources: dict[str, float] | None = None, node_type: str = "cpu") -> FakeRaylet:
        raylet = FakeRaylet(resources or {"CPU": 4}, node_type)
        await raylet.start()
        started.append(raylet)
        return raylet

    yield make
    for raylet in started:
        await raylet.stop()


@pytest.fixture
def gc_state() -> Iterator[None]:
    """The collector's thresholds and callbacks, restored after the test."""
    threshold, callbacks = gc.get_threshold(), list(gc.callbacks)
    try:
        yield
    finally:
        gc.callbacks[:] = callbacks
        gc.set_threshold(*threshold)
