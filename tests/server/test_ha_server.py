"""Two in-process ``GcsServer``s with ``ha.enabled`` on one MemoryStore (two handles, as two
processes on one Redis) and one port, on the fake clock: the whole server under the
coordinator -- a term's components load from the standby's mirror, bind the shared port,
and close it when the lease is lost."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gcs.base.clock import FakeClock
from gcs.config import GcsConfig, HaConfig
from gcs.proto import gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.server import GcsServer
from gcs.server.ha import Role
from gcs.store.memory import MemoryStore
from gcs.testing.ha_group import FAST_RECONNECT, GrpcKv
from gcs.testing.ports import free_port

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _health(server: GcsServer) -> int:
    """The member's own health port (``ha.status_port``): answered by standbys too."""
    assert server.ha_status is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ha_status.port}") as channel:
        for _ in range(100):  # set() lands on the next loop turns
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
            expected = SERVING if server.ha is not None and server.ha.serving else NOT_SERVING
            if reply.status == expected:
                break
            await asyncio.sleep(0.01)
        return int(reply.status)


def _config(port: int, holder: str) -> GcsConfig:
    return GcsConfig(
        port=port,
        metrics_port=-1,
        storage="memory://",
        ha=HaConfig(enabled=True, holder=holder, status_port=0),
    )


async def test_takeover_in_process_serves_the_leaders_state_on_the_same_port() -> None:
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    port = free_port()
    address = f"127.0.0.1:{port}"
    a_store, b_store = shared.handle(), shared.handle()
    a = GcsServer(_config(port, "a"), store=a_store, clock=clock)
    b = GcsServer(_config(port, "b"), store=b_store, clock=clock)
    kv = GrpcKv(address)
    try:
        await a.start()
        assert a.ha is not None
        await clock.advance_until(lambda: a.ha is not None and a.ha.serving, 0.05)
        assert a.port == port and a.managers is not None
        assert await kv.put(b"ns", b"k", b"from-a", overwrite=True)
        async with grpc.aio.insecure_channel(address) as channel:
            nodes = ServiceStub(channel, svc.NODE_INFO, timeout_s=10)
            await nodes.RegisterNode(
                G.RegisterNodeRequest(
                    node_info=gcs_pb2.GcsNodeInfo(
                        node_id=b"\x07" * 28,
                        node_manager_address="127.0.0.1",
                        node_manager_port=1,
                        state=gcs_pb2.GcsNodeInfo.ALIVE,
                    )
                )
            )
        await b.start()  # warm: a standby, no port of its own
        assert b.ha is not None and b.ha.role is Role.STANDBY and b.port == 0
        assert await _health(a) == SERVING and await _health(b) == NOT_SERVING

        a_store.fail_writes = True  # a loses the store: its renewals fail
        # b may serve while a is still closing its term (a refuses every call from the
        # moment it steps down): wait for both
        await clock.advance_until(
            lambda: b.ha is not None and b.ha.serving and a.managers is None, 0.05
        )
        assert a.ha.role is Role.STANDBY and a.managers is None  # its term closed
        assert a.ha.step_downs == 1 and b.ha.epoch > a.ha.epoch
        assert b.port == port
        assert await _health(a) == NOT_SERVING and await _health(b) == SERVING
        assert await kv.get(b"ns", b"k") == b"from-a"  # same address, the store's state
        assert await kv.put(b"ns", b"k2", b"from-b", overwrite=True)
        assert b.managers is not None
        assert b.managers.nodes.is_alive(b"\x07" * 28), "loaded alive from the mirror"
        with pytest.raises(Exception, match="superseded"):  # a's writes are fenced
            a_store.fail_writes = False
            await a_store.put("KV", b"x", b"y")

        # and back: a, a standby again, takes over in the same process (a second term)
        b_store.fail_writes = True
        await clock.advance_until(
            lambda: a.ha is not None and a.ha.serving and b.managers is None, 0.05
        )
        assert b.ha.role is Role.STANDBY and a.ha.takeovers == 2
        assert await kv.get(b"ns", b"k2") == b"from-b"
        families = {f.name for f in a.metrics.registry.collect()}
        assert {"gcs_ha_role", "gcs_store_op_seconds", "gcs_nodes"} <= families
    finally:
        await kv.close()
        await b.stop()
        await a.stop()


async def test_a_stopped_leader_releases_the_lease_and_closes_the_port() -> None:
    clock = FakeClock()
    shared = MemoryStore(clock=clock)
    port = free_port()
    a = GcsServer(_config(port, "a"), store=shared.handle(), clock=clock)
    await a.start()
    assert a.ha is not None
    await clock.advance_until(lambda: a.ha is not None and a.ha.serving, 0.05)
    await a.stop()
    lease = await shared.read_lease()
    assert lease is not None and lease.remaining_ms <= 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=FAST_RECONNECT) as ch:
        with pytest.raises(grpc.aio.AioRpcError):
            await ServiceStub(ch, svc.NODE_INFO, timeout_s=1).GetClusterId(G.GetClusterIdRequest())


def test_ha_config_is_off_by_default() -> None:
    config = GcsConfig()
    assert config.ha == HaConfig() and not config.ha.enabled
    assert dataclasses.replace(config.ha, enabled=True).lease_ttl_ms == 2000
