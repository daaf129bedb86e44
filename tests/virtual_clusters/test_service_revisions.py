"""Every change of a cluster's nodes gives it a new revision, stored and published on
channel 11 (issue 18 item 8), through a running GCS: a member's death, an operator's
RemoveNodes, the autoscaler's flagged release; each makes an update at the old revision
fail."""

from __future__ import annotations

import asyncio

import grpc

from gcs.proto import pubsub_pb2, virtual_cluster_pb2
from gcs.proto.virtual_cluster_data_pb2 import VirtualClusterTableData
from gcs.sdk._subscriber import GcsSubscriber

V = virtual_cluster_pb2
HANG_S = 30.0
"""Bounds a hang only: the sentinel is published at once."""


class Channel11:
    """A real subscriber; :meth:`through` publishes a sentinel cluster and waits for it
    (the channel is ordered: everything published before it has arrived)."""

    def __init__(self, env) -> None:  # type: ignore[no-untyped-def]
        self.env = env
        self.got: list[VirtualClusterTableData] = []
        self._sentinels = 0
        self._arrived = asyncio.Event()

    def _on(self, message: pubsub_pb2.PubMessage) -> None:
        data = message.virtual_cluster_message
        if data.id.startswith("sentinel"):
            self._arrived.set()
        else:
            self.got.append(data)

    async def __aenter__(self) -> Channel11:
        self._channel = grpc.aio.insecure_channel(self.env.server.address)
        self._sub = GcsSubscriber(self._channel, on_message=self._on)
        await self._sub.start()
        await self._sub.subscribe(pubsub_pb2.RAY_VIRTUAL_CLUSTER_CHANNEL)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._sub.close()
        await self._channel.close()

    async def through(self) -> list[VirtualClusterTableData]:
        self._sentinels += 1
        self._arrived.clear()
        reply = await self.env.create(f"sentinel{self._sentinels}", {})
        assert reply.status.code == 0, reply.status.message
        await asyncio.wait_for(self._arrived.wait(), HANG_S)
        got, self.got = self.got, []
        return got


async def revision(env, cluster_id: str) -> int:  # type: ignore[no-untyped-def]
    (data,) = (await env.clusters(cluster_id)).values()
    return int(data.revision)


async def stale_update_fails(env, cluster_id: str, old: int) -> None:  # type: ignore[no-untyped-def]
    reply = await env.create(cluster_id, {"4c8g": 1}, revision=old)
    assert "is expired" in reply.status.message, reply.status


async def test_member_death_is_a_new_revision_stored_and_published(memory_env) -> None:
    env = memory_env
    created = await env.create("ind", {"4c8g": 2})
    victim = sorted(created.node_instances)[0]
    async with Channel11(env) as channel:
        await env.kill(victim)
        await env.manager.settle()
        (published,) = await channel.through()
    now = await revision(env, "ind")
    assert now > created.revision and published.revision == now
    assert victim in published.node_instances  # dead, awaiting replenishment
    rows = await env.store.get_all("VIRTUAL_CLUSTER")
    assert VirtualClusterTableData.FromString(rows[b"ind"]).revision == now
    await stale_update_fails(env, "ind", created.revision)


async def test_removals_are_new_revisions_and_a_release_keeps_the_floor(
    memory_env,
) -> None:
    """An operator's RemoveNodes and the autoscaler's release (flagged, with the revision it
    read) both give a new revision; the release is refused below the declared floor."""
    env = memory_env
    created = await env.create("ind", {"4c8g": 2})
    first, second = sorted(created.node_instances)
    async with Channel11(env) as channel:
        reply = await env.vc.RemoveNodesFromVirtualCluster(
            V.RemoveNodesFromVirtualClusterRequest(
                virtual_cluster_id="ind", nodes_to_remove=[first]
            )
        )
        assert reply.status.code == 0, reply.status.message
        (published,) = await channel.through()
    after_operator = await revision(env, "ind")
    assert after_operator > created.revision
    assert published.revision == after_operator and set(published.node_instances) == {second}
    assert dict(published.declared_replica_sets) == {"4c8g": 1}  # the operator lowered it
    await stale_update_fails(env, "ind", created.revision)

    refused = await env.vc.RemoveNodesFromVirtualCluster(
        V.RemoveNodesFromVirtualClusterRequest(
            virtual_cluster_id="ind",
            nodes_to_remove=[second],
            revision=after_operator,
            autoscaler_move=True,
        )
    )
    assert "below its floor (4c8g: 1)" in refused.status.message
    assert list(refused.nodes_with_failure) == [second]
    assert await revision(env, "ind") == after_operator
