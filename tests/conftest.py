"""Shared fixtures: a GCS server on a free port with an in-memory store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gcs.config import GcsConfig, HealthCheckConfig, LoadPollConfig
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore


def fast_config(**overrides: object) -> GcsConfig:
    """Ray's defaults scaled down so tests observe deaths and polls in well under a second."""
    base = {
        "host": "127.0.0.1",
        "port": 0,
        "metrics_port": -1,
        "health": HealthCheckConfig(
            initial_delay_ms=100, period_ms=100, timeout_ms=200, failure_threshold=3
        ),
        "load_poll": LoadPollConfig(period_ms=100, timeout_ms=300),
    }
    base.update(overrides)
    return GcsConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
async def memory_store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
async def gcs_server(memory_store: MemoryStore) -> AsyncIterator[GcsServer]:
    server = GcsServer(fast_config(), store=memory_store)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
