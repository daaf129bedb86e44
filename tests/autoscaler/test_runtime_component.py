"""The autoscaler as a component (``gcs.base.lifecycle``), on the toy provider and a fake GCS,
with time driven by the test: built from narrow arguments, run by the Supervisor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from gcs.autoscaler.config import ConfigError, parse_cluster_config
from gcs.autoscaler.metrics import MetricSource
from gcs.autoscaler.providers.base import Capabilities, ProviderContext
from gcs.autoscaler.providers.registry import ProviderRow
from gcs.autoscaler.runtime import (
    DEFAULT_INTERVAL_S,
    AutoscalerRuntime,
    embedded_autoscaler,
    interval_from_env,
)
from gcs.base.lifecycle import Component, Supervisor
from gcs.policy.autoscaling.model import InstanceStatus, NodeKind
from gcs.proto import autoscaler_pb2
from gcs.rpc.security import Security
from gcs.store.memory import MemoryStore
from gcs.testing.cloud import FakeAutoscalerGcs
from tests.autoscaler.clock import SteppedClock
from tests.autoscaler.toy_provider import TOY_PROVIDERS, ToyProvider
from tests.autoscaler.toy_provider import build as build_toy

INTERVAL_S = 5.0
ROUND_TIMEOUT_S = 60.0
"""Bounds a hang only: every round here is in-process work."""

CLUSTER = {
    "max_workers": 4,
    "upscaling_speed": 100,
    "provider": {"type": "toy"},
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {"CPU": 0}, "max_workers": 0},
        "cpu": {"resources": {"CPU": 4}, "max_workers": 4},
    },
}


def build_ephemeral(context: ProviderContext) -> ToyProvider:
    """The toy, declaring that its instances live and die with ``gcs serve``."""
    provider = build_toy(context)
    provider.capabilities = Capabilities(starts_head=True, ends_with_server=True)  # type: ignore[misc]
    return provider


PROVIDERS = TOY_PROVIDERS.with_rows(
    ProviderRow("toy-ephemeral", "tests.autoscaler.test_runtime_component:build_ephemeral")
)


class World:
    """A runtime over the toy provider, a fake GCS and a clock the test moves."""

    def __init__(self, tmp: Path, provider_type: str = "toy", *, embedded: bool = False) -> None:
        self.clock = SteppedClock()
        self.gcs = FakeAutoscalerGcs()
        self.sources: list[MetricSource] = []
        cluster = parse_cluster_config(
            {**CLUSTER, "provider": {"type": provider_type}}, providers=PROVIDERS
        )
        if embedded:
            self.rt = embedded_autoscaler(
                cluster,
                gcs_address="127.0.0.1:1",
                store=MemoryStore(),
                security=Security(),
                data_dir=tmp,
                register_metrics=self.sources.append,
                clock=self.clock,
                environ={"AUTOSCALER_UPDATE_INTERVAL_S": str(INTERVAL_S)},
                gcs=self.gcs,
                providers=PROVIDERS,
            )
        else:
            self.rt = AutoscalerRuntime(
                cluster,
                "127.0.0.1:1",
                state_dir=tmp,
                store=MemoryStore(),
                clock=self.clock,
                interval_s=INTERVAL_S,
                security=Security(),
                gcs=self.gcs,
                providers=PROVIDERS,
                register_metrics=self.sources.append,
            )
        self.toy: ToyProvider = self.rt.provider  # type: ignore[assignment]

    async def next_round(self) -> None:
        """Move time to the next round and wait for it to complete."""
        done = self.rt.round_completed()
        await self.clock.advance_when_sleeping(INTERVAL_S)
        await asyncio.wait_for(done.wait(), ROUND_TIMEOUT_S)

    def ray_node(self, cloud_id: str, node_type: str, **resources: float) -> None:
        self.gcs.state.node_states.add(
            node_id=bytes.fromhex(f"{len(self.gcs.state.node_states) + 1:056x}"),
            instance_id=cloud_id,
            ray_node_type_name=node_type,
            status=autoscaler_pb2.IDLE,
            total_resources=resources,
            available_resources=resources,
        )

    def statuses(self) -> list[tuple[str, InstanceStatus]]:
        return sorted((i.instance_type, i.status) for i in self.rt.instances.instances.values())


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    yield w
    await w.rt.close()


class TestComponent:
    async def test_is_a_component_named_autoscaler(self, world: World) -> None:
        assert isinstance(world.rt, Component) and world.rt.name == "autoscaler"

    async def test_load_reads_instances_and_offers_metrics_but_launches_nothing(
        self, world: World
    ) -> None:
        await world.rt.load()
        assert world.toy.instances == {} and world.clock.sleepers == 0
        (source,) = world.sources
        registry = CollectorRegistry()

        class Source(Collector):
            def collect(self):  # type: ignore[no-untyped-def]
                return source()

        registry.register(Source())
        assert "gcs_autoscaler_rounds_total 0.0" in generate_latest(registry).decode()

    async def test_supervisor_runs_rounds_on_the_clock_then_closes_it(self, world: World) -> None:
        """The head comes up first (the toy ``starts_head``); once its Ray node runs, demand
        is launched the next round; rounds happen only when the clock moves."""
        supervisor = Supervisor([world.rt])
        await supervisor.load()
        first = world.rt.round_completed()
        running = asyncio.ensure_future(supervisor.run())
        await asyncio.wait_for(first.wait(), ROUND_TIMEOUT_S)  # the first round runs at once
        (head,) = world.toy.instances.values()
        assert head.node_kind is NodeKind.HEAD
        world.ray_node(head.cloud_instance_id, "head", **{"node:__internal_head__": 1.0})
        world.gcs.state.pending_resource_requests.add(
            request=autoscaler_pb2.ResourceRequest(resources_bundle={"CPU": 4}), count=2
        )
        rounds = world.rt.completed_rounds
        await world.clock.sleeping()
        assert world.rt.completed_rounds == rounds  # nothing happens until time moves
        await world.next_round()
        await world.rt.updater.settle()
        launched = sorted(ci.node_type for ci in world.toy.instances.values())
        assert launched == ["cpu", "cpu", "head"]
        await world.next_round()
        allocated, ray_running = InstanceStatus.ALLOCATED, InstanceStatus.RAY_RUNNING
        assert world.statuses() == [("cpu", allocated), ("cpu", allocated), ("head", ray_running)]
        assert world.rt.reconciler.failed_rounds == 0
        assert world.gcs.reports and world.gcs.kv  # reported, events published
        supervisor.stop()
        await running
        await supervisor.close()
        assert len(world.toy.instances) == 3  # a standalone autoscaler leaves them running
        await world.rt.close()  # idempotent

    async def test_close_is_safe_before_load(self, world: World) -> None:
        await world.rt.close()
        await world.rt.close()


class TestEmbedded:
    async def test_close_terminates_instances_of_a_provider_that_ends_with_the_server(
        self, tmp_path: Path
    ) -> None:
        w = World(tmp_path, "toy-ephemeral", embedded=True)
        await w.rt.start()
        await asyncio.wait_for(w.rt.round_completed().wait(), ROUND_TIMEOUT_S)
        assert len(w.toy.instances) == 1  # the head
        await w.rt.close()
        assert w.toy.instances == {}

    async def test_the_production_registry_has_no_toy(self, tmp_path: Path) -> None:
        cluster = parse_cluster_config(CLUSTER, providers=PROVIDERS)
        with pytest.raises(ConfigError, match="'toy' is not supported here"):
            embedded_autoscaler(
                cluster,
                gcs_address="127.0.0.1:1",
                store=MemoryStore(),
                security=Security(),
                data_dir=tmp_path,
                gcs=FakeAutoscalerGcs(),
            )

    def test_interval_from_the_environment_as_ray_reads_it(self) -> None:
        assert interval_from_env({}) == DEFAULT_INTERVAL_S
        assert interval_from_env({"AUTOSCALER_UPDATE_INTERVAL_S": "0.5"}) == 0.5
        assert interval_from_env({"AUTOSCALER_UPDATE_INTERVAL_S": "0"}) == DEFAULT_INTERVAL_S
        assert interval_from_env({"AUTOSCALER_UPDATE_INTERVAL_S": "x"}) == DEFAULT_INTERVAL_S
