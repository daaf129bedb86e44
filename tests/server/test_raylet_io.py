"""The raylet I/O layer (gcs.rpc.raylet_io) against real raylets, and a restart at scale."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from gcs.base.errors import RayletUnreachable, RayStatusError
from gcs.config import RayletIoConfig, load_config
from gcs.proto import common_pb2, node_manager_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc.raylet_io.budget import RayletIoBudget
from gcs.rpc.raylet_io.grpc_gateway import GrpcRayletGateway
from gcs.rpc.raylet_io.pool import RayletClientPool
from gcs.server.app import GcsServer
from gcs.store import WriteBatch
from gcs.store.base import TABLE_NODE
from gcs.store.memory import MemoryStore
from gcs.testing.fake_raylets import FakeRayletGateway
from tests.conftest import Stubs
from tests.server.fake_raylet import FakeRaylet


def refused_port() -> int:
    """A loopback port below the ephemeral range that nobody listens on."""
    for port in range(32000, 20000, -13):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise RuntimeError("no refused port")


def gateway(transport: str = "h2", **budget: int) -> GrpcRayletGateway:
    values = {"max_open_clients": 64, "max_in_flight": 32, "max_calls_per_s": 0, **budget}
    return GrpcRayletGateway(RayletIoBudget(**values), poll_transport=transport)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class TestGateway:
    @pytest.mark.parametrize("transport", ["h2", "grpc"])
    async def test_every_call_reaches_the_raylet(self, raylets, transport: str) -> None:
        """Load, health, notify, drain and resize answer as the raylet says, on both transports."""
        raylet = await raylets({"CPU": 4.0})
        address = f"127.0.0.1:{raylet.port}"
        gw = gateway(transport)
        try:
            data = await gw.get_resource_load(raylet.node_id, address, 5.0)
            assert dict(data.resources_total) == {"CPU": 4.0}
            assert await gw.health_check(raylet.node_id, address, 5.0)
            await gw.notify_gcs_restart(raylet.node_id, address, 5.0)
            assert raylet.notified == 1
            reply = await gw.drain(
                raylet.node_id, address, node_manager_pb2.DrainRayletRequest(), 5.0
            )
            assert reply.is_accepted
            assert await gw.resize(raylet.node_id, address, {"CPU": 2.0}, 5.0) == {"CPU": 2.0}
        finally:
            await gw.close()

    async def test_bundle_calls_use_http2_and_a_missing_method_keeps_polls_there(
        self, raylets
    ) -> None:
        """Prepare / commit go over the lean client (no grpc channel: ~0.3-0.5 ms of CPU
        saved per call); a raylet without ``RemovePlacementGroupBundles`` answers
        UNIMPLEMENTED, which is an error of that call, not a reason to poll it with grpc."""
        raylet = await raylets()
        address = f"127.0.0.1:{raylet.port}"
        bundle = common_pb2.Bundle(unit_resources={"CPU": 1.0})
        bundle.bundle_id.placement_group_id = b"\x07" * 18
        gw = gateway("h2")
        try:
            assert await gw.prepare_bundles(raylet.node_id, address, [bundle], 5.0)
            await gw.commit_bundles(raylet.node_id, address, [bundle], 5.0)
            assert raylet.committed == [(b"\x07" * 18, 0)]
            with pytest.raises((RayStatusError, RayletUnreachable)):
                await gw.remove_bundles(raylet.node_id, address, b"\x07" * 18, [bundle], 5.0)
            assert raylet.node_id not in gw.grpc_only
            client = gw.pool.lease(raylet.node_id, address)
            assert not client.has_channel
            gw.pool.release(client)
        finally:
            await gw.close()

    async def test_refusals_and_unreachable_raylets_are_domain_errors(self, raylets) -> None:
        """A raylet's INVALID_ARGUMENT is a RayStatusError; a refused connection is
        RayletUnreachable naming the node, for every kind of call."""
        raylet = await raylets()
        gw = gateway()
        dead = os.urandom(28)
        dead_address = f"127.0.0.1:{refused_port()}"
        try:
            with pytest.raises(RayStatusError, match="GPU cannot be resized"):
                await gw.resize(raylet.node_id, f"127.0.0.1:{raylet.port}", {"GPU": 1.0}, 5.0)
            for call in (gw.get_resource_load, gw.health_check, gw.notify_gcs_restart):
                with pytest.raises(RayletUnreachable) as err:
                    await call(dead, dead_address, 2.0)
                assert err.value.node_id == dead
            with pytest.raises(RayletUnreachable):
                await gw.drain(dead, dead_address, node_manager_pb2.DrainRayletRequest(), 2.0)
        finally:
            await gw.close()

    async def test_calls_in_flight_stay_within_the_budget(self, raylets) -> None:
        """40 nodes polled at once through 5 slots: the raylet never sees more than 5."""
        raylet = await raylets()
        raylet.gate = asyncio.Event()
        gw = gateway(max_in_flight=5, max_open_clients=8)
        address = f"127.0.0.1:{raylet.port}"
        try:
            polls = [
                asyncio.create_task(gw.get_resource_load(os.urandom(28), address, 5.0))
                for _ in range(40)
            ]
            await raylet.changes.until(lambda: raylet.in_flight == 5)
            raylet.gate.set()
            await asyncio.gather(*polls)
            assert raylet.max_in_flight == 5
            assert len(gw.pool) <= 8
        finally:
            await gw.close()


class TestPool:
    async def test_least_recently_used_idle_client_is_evicted(self) -> None:
        pool = RayletClientPool(max_open=3)
        a, b, c, d = (bytes([i]) * 28 for i in range(4))
        held = pool.lease(a, "127.0.0.1:1")
        for node_id in (b, c):
            pool.release(pool.lease(node_id, "127.0.0.1:1"))
        pool.release(pool.lease(b, "127.0.0.1:1"))  # b is now more recent than c
        pool.release(pool.lease(d, "127.0.0.1:1"))
        assert len(pool) == 3
        assert pool.evictions == 1
        assert pool.lease(a, "127.0.0.1:1") is held  # leased: never evicted, c went
        assert pool.lease(c, "127.0.0.1:1") is not None and pool.evictions == 2
        await pool.close()

    async def test_a_new_address_replaces_the_client(self) -> None:
        pool = RayletClientPool(max_open=2)
        node_id = b"n" * 28
        first = pool.lease(node_id, "127.0.0.1:1")
        pool.release(first)
        assert pool.lease(node_id, "127.0.0.1:2") is not first
        assert len(pool) == 1
        await pool.close()


async def store_with_nodes(count: int, port: int) -> MemoryStore:
    store = MemoryStore()
    batch = WriteBatch()
    for i in range(count):
        node_id = i.to_bytes(4, "big") + os.urandom(24)
        info = FakeRaylet({"CPU": 1.0}).node_info(node_id=node_id, node_manager_port=port)
        batch.put(TABLE_NODE, node_id, info.SerializeToString())
    await store.write(batch)
    return store


class TestRestartAtScale:
    async def test_restart_reaches_known_raylets_within_the_budget(self, raylets) -> None:
        """Issue 12 defect 4: 300 nodes known from the store, all served by one raylet that
        holds every call open.  At most max_in_flight calls reach it at once and the GCS
        keeps at most max_open_clients connections (the old code sent all 300
        NotifyGCSRestart and polls at once, one grpc channel and one HTTP/2 connection each)."""
        raylet = await raylets()
        raylet.gate = asyncio.Event()
        store = await store_with_nodes(300, raylet.port)
        config = load_config(
            env={"GCS_RAYLET_MAX_IN_FLIGHT": "8", "GCS_RAYLET_MAX_OPEN_CLIENTS": "16"},
            flags={"host": "127.0.0.1", "port": 0, "metrics_port": -1},
        )
        baseline = open_fds()
        server = GcsServer(config, store=store)
        await server.start()
        try:
            # the raylet holds every call: once the budget is full nothing more can start,
            # so the connections open now are the most there will be until the release
            await raylet.changes.until(lambda: raylet.in_flight == 8)
            # each connection is two fds here (both ends are in this process)
            assert open_fds() - baseline <= 2 * 16 + 40
            raylet.gate.set()
            await raylet.changes.until(lambda: raylet.notified == 300)
            assert raylet.max_in_flight <= 8  # over the whole restart
        finally:
            raylet.gate.set()
            await server.stop()

    async def test_grpc_serves_before_any_raylet_is_contacted(self) -> None:
        """The first raylet call comes after the server answers RPCs."""
        import grpc

        store = await store_with_nodes(50, refused_port())
        fake = FakeRayletGateway()
        fake.hold()
        from tests.conftest import fast_config

        server = GcsServer(fast_config(), store=store, raylets=fake)
        started = asyncio.Event()
        original_enter = fake._enter

        async def enter(method: str, node_id: bytes, address: str) -> None:
            if not started.is_set():
                async with grpc.aio.insecure_channel(server.address) as channel:
                    assert server.meta is not None
                    stubs = Stubs(channel, server.meta.cluster_id)
                    await stubs.node_info.GetClusterId(G.GetClusterIdRequest(), timeout=30)
                started.set()
            await original_enter(method, node_id, address)

        fake._enter = enter  # type: ignore[method-assign]
        await server.start()
        try:
            await asyncio.wait_for(started.wait(), 10)
            assert len(fake.calls_to("NotifyGCSRestart")) + len(fake.calls) >= 1
        finally:
            fake.release()
            await server.stop()


class TestConfig:
    def test_knobs_come_from_env_and_are_validated(self) -> None:
        config = load_config(
            env={"GCS_RAYLET_MAX_OPEN_CLIENTS": "100", "GCS_RAYLET_MAX_CALLS_PER_S": "0"}
        )
        assert config.raylet_io == RayletIoConfig(max_open_clients=100, max_calls_per_s=0)
        from gcs.config import ConfigError

        with pytest.raises(ConfigError, match="max_in_flight"):
            load_config(env={"GCS_RAYLET_MAX_IN_FLIGHT": "-1"})
        with pytest.raises(ConfigError, match="startup_contacts_per_s"):
            load_config(env={"GCS_RAYLET_STARTUP_CONTACTS_PER_S": "0"})
