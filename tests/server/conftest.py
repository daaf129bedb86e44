from __future__ import annotations

from collections.abc import AsyncIterator, Callable

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
