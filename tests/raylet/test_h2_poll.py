"""The lean HTTP/2 poll client against the real raylet agent's NodeManagerService."""

from __future__ import annotations

import asyncio

import grpc

from gcs.proto import node_manager_pb2
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import NODE_MANAGER
from gcs.rpc.raylet_io.h2_unary import H2UnaryClient
from gcs.rpc.raylet_io.pool import GET_RESOURCE_LOAD_PATH


class TestH2AgainstTheAgent:
    async def test_h2_reply_equals_the_grpc_reply(self, make_agent) -> None:
        """Byte for byte the same ResourcesData as grpc.aio gets, for many concurrent polls."""
        agent = await make_agent(resources={"CPU": 2.0, "memory": 1e9}, labels={"zone": "a"})
        async with grpc.aio.insecure_channel(agent.address) as channel:
            expected = await ServiceStub(channel, NODE_MANAGER).GetResourceLoad(
                node_manager_pb2.GetResourceLoadRequest(), timeout=30
            )
        client = H2UnaryClient(agent.address, GET_RESOURCE_LOAD_PATH)
        try:
            replies = await asyncio.gather(*(client.call(b"", 30.0) for _ in range(50)))
        finally:
            client.close()
        for raw in replies:
            reply = node_manager_pb2.GetResourceLoadReply.FromString(raw)
            assert reply.resources.node_id == agent.node_id
            assert dict(reply.resources.labels) == dict(expected.resources.labels)
            assert dict(reply.resources.resources_total) == {"CPU": 2.0, "memory": 1e9}
