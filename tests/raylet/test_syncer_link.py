"""The agent speaks Ray's syncer as a 2.60 raylet does: its view right after connecting, then
only on change; it learns the other raylets' views from the GCS hub; it reconnects."""

from __future__ import annotations

from typing import Any

from gcs.proto import ray_syncer_pb2
from gcs.raylet.agent import RayletAgent, RayletConfig
from gcs.raylet.sync_link import view_fingerprint
from gcs.server.app import GcsServer
from tests.conftest import fast_config
from tests.raylet.conftest import FAST


async def _agent(gcs_server: GcsServer, **overrides: Any) -> RayletAgent:
    fields: dict[str, Any] = {"gcs_address": gcs_server.address, "resources": {"CPU": 2.0}}
    fields.update(FAST)
    fields.update(overrides)
    agent = RayletAgent(RayletConfig(**fields))
    await agent.start()
    return agent


def _held_view(gcs_server: GcsServer, agent: RayletAgent) -> ray_syncer_pb2.ResourceViewSyncMessage:
    assert gcs_server.managers is not None
    data = gcs_server.managers.resources.nodes[agent.node_id].data
    return ray_syncer_pb2.ResourceViewSyncMessage(
        resources_available=data.resources_available, idle_duration_ms=data.idle_duration_ms
    )


class TestAgentSyncer:
    async def test_view_after_connect_then_only_on_change(self, gcs_server: GcsServer) -> None:
        agent = await _agent(gcs_server)
        hub = gcs_server.managers.syncer  # type: ignore[union-attr]
        try:
            assert agent.syncer is not None
            await hub.changes.until(lambda: hub.live_version(agent.node_id) == 1)
            # the agent counts a view once its write returned (the hub may have it first)
            await agent.syncer.changes.until(lambda: agent.syncer.stats.sent == 1)  # type: ignore[union-attr]
            # nothing changed: idle raylets send nothing (however often they are told)
            for _ in range(3):
                agent.on_view_changed()
            servicer = agent.servicer
            assert servicer is not None
            # a granted lease: busy, one CPU used -> version 2 with the node's activity
            lease_id = servicer.hold({"CPU": 1.0})
            assert lease_id is not None
            await hub.changes.until(lambda: hub.live_version(agent.node_id) == 2)
            await agent.syncer.changes.until(lambda: agent.syncer.stats.sent == 2)  # type: ignore[union-attr]
            held = _held_view(gcs_server, agent)
            assert held.resources_available["CPU"] == 1.0 and held.idle_duration_ms == 0
            snapshot = gcs_server.managers.nodes.alive[agent.node_id].state_snapshot  # type: ignore[union-attr]
            assert list(snapshot.node_activity) == ["Resource: CPU currently in use."]
            # released: idle again -> version 3
            servicer.free(lease_id)
            await hub.changes.until(lambda: hub.live_version(agent.node_id) == 3)
            assert _held_view(gcs_server, agent).idle_duration_ms >= 1
        finally:
            await agent.stop()

    async def test_raylets_learn_each_others_views(self, gcs_server: GcsServer) -> None:
        a = await _agent(gcs_server)
        b = await _agent(gcs_server)
        try:
            assert a.syncer is not None and b.syncer is not None
            await a.syncer.changes.until(lambda: a.syncer.views.get(b.node_id) == 1)  # type: ignore[union-attr]
            await b.syncer.changes.until(lambda: b.syncer.views.get(a.node_id) == 1)  # type: ignore[union-attr]
            assert a.node_id not in a.syncer.views  # never its own view back
            assert a.syncer.stats.received >= 1
        finally:
            await a.stop()
            await b.stop()

    async def test_reconnects_and_sends_its_view_again(self, gcs_server: GcsServer) -> None:
        """A dropped stream (e.g. a GCS restart) is reopened after the back-off and the
        current view is sent again, even when it did not change meanwhile."""
        agent = await _agent(gcs_server)
        hub = gcs_server.managers.syncer  # type: ignore[union-attr]
        try:
            assert agent.syncer is not None
            await hub.changes.until(lambda: hub.live_version(agent.node_id) == 1)
            sent = agent.syncer.stats.sent
            hub.peers[agent.node_id].close()  # the GCS ends the stream
            await agent.syncer.changes.until(lambda: agent.syncer.stats.connects == 2)  # type: ignore[union-attr]
            await agent.syncer.changes.until(lambda: agent.syncer.stats.sent == sent + 1)  # type: ignore[union-attr]
            await hub.changes.until(lambda: hub.live_version(agent.node_id) == 1)
        finally:
            await agent.stop()

    async def test_off_opens_no_stream(self, gcs_server: GcsServer) -> None:
        agent = await _agent(gcs_server, syncer=False)
        try:
            assert agent.syncer is None
            assert gcs_server.managers.syncer.live_version(agent.node_id) is None  # type: ignore[union-attr]
        finally:
            await agent.stop()


async def test_the_grpc_aio_path_serves_the_agent_too() -> None:
    """``front_server: false``: StartSync on grpc.aio (the servicer), same behaviour."""
    server = GcsServer(fast_config(front_server=False))
    await server.start()
    try:
        a = await _agent(server)
        b = await _agent(server)
        try:
            await a.syncer.changes.until(lambda: a.syncer.views.get(b.node_id) == 1)  # type: ignore[union-attr]
            lease_id = b.servicer.hold({"CPU": 2.0})  # type: ignore[union-attr]
            assert lease_id is not None
            await a.syncer.changes.until(lambda: a.syncer.views.get(b.node_id) == 2)  # type: ignore[union-attr]
        finally:
            await a.stop()
            await b.stop()
    finally:
        await server.stop()


def test_idle_duration_alone_is_no_change() -> None:
    """Ray bumps the version on idle <-> busy, not as the idle time grows."""
    a = ray_syncer_pb2.ResourceViewSyncMessage(resources_available={"CPU": 1}, idle_duration_ms=5)
    b = ray_syncer_pb2.ResourceViewSyncMessage(resources_available={"CPU": 1}, idle_duration_ms=9)
    busy = ray_syncer_pb2.ResourceViewSyncMessage(resources_available={"CPU": 1})
    assert view_fingerprint(a) == view_fingerprint(b) != view_fingerprint(busy)
