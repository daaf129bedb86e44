"""Fixtures: a fake GCS on a free port and a factory of raylet agents registered with it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from gcs.base.clock import FakeClock
from gcs.raylet.agent import RayletAgent, RayletConfig
from gcs.raylet.testing import FakeGcs
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import NODE_MANAGER

FAST = {"liveness_check_interval_ms": 50, "reconnect_backoff_initial_ms": 20,
        "reconnect_backoff_max_ms": 100, "register_timeout_s": 5.0}  # fmt: skip


@pytest.fixture
async def fake_gcs() -> AsyncIterator[FakeGcs]:
    gcs = FakeGcs()
    await gcs.start()
    yield gcs
    await gcs.stop()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


AgentFactory = Callable[..., Awaitable[RayletAgent]]


@pytest.fixture
async def make_agent(fake_gcs: FakeGcs, clock: FakeClock) -> AsyncIterator[AgentFactory]:
    agents: list[RayletAgent] = []

    async def make(**overrides: Any) -> RayletAgent:
        fields: dict[str, Any] = {"gcs_address": fake_gcs.address, "resources": {"CPU": 2.0}}
        fields.update(FAST)
        fields.update(overrides)
        agent = RayletAgent(RayletConfig(**fields), clock=clock)
        agents.append(agent)
        await agent.start()
        return agent

    yield make
    for agent in agents:
        await agent.stop()


@pytest.fixture
async def node_manager() -> AsyncIterator[Callable[[RayletAgent], ServiceStub]]:
    channels: list[grpc.aio.Channel] = []

    def connect(agent: RayletAgent) -> ServiceStub:
        channel = grpc.aio.insecure_channel(agent.address)
        channels.append(channel)
        return ServiceStub(channel, NODE_MANAGER, timeout_s=30)

    yield connect
    for channel in channels:
        await channel.close()
