"""kill -9 of the GCS mid-write-load on Redis: nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import grpc
import pytest

from gcs.proto import autoscaler_pb2 as A
from gcs.proto import gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import NODE_INFO
from tests.conftest import Stubs
from tests.server.gcs_process import GcsProcess

pytestmark = pytest.mark.slow

# A writer stops at its first failed call, and a stop before the crash fails the test: the
# deadline is generous so a loaded machine cannot stop one.  The kill itself fails in-flight
# calls at once (UNAVAILABLE), so this does not slow the test down.
RPC_TIMEOUT_S = 30


async def connect(address: str) -> tuple[grpc.aio.Channel, Stubs]:
    channel = grpc.aio.insecure_channel(address)
    reply = await ServiceStub(channel, NODE_INFO, timeout_s=30).GetClusterId(
        G.GetClusterIdRequest()
    )
    return channel, Stubs(channel, reply.cluster_id)


class TestKillNineOnRedis:
    async def test_acknowledged_writes_survive_and_versions_move_forward(
        self, redis_server, tmp_path
    ) -> None:
        """Writers record every acknowledged KV put, node registration and constraint; the
        server is SIGKILLed mid-load; after restart all of them are there, the cluster id is
        the same and the resource-state version is above every version served before."""
        namespace = f"crash-{uuid.uuid4().hex[:8]}"
        gcs = GcsProcess(
            storage=redis_server.url,
            extra_args=("--namespace", namespace),
            log_path=str(tmp_path / "gcs.log"),
        ).start()
        channel, stubs = await connect(gcs.address)
        acked_keys: list[bytes] = []
        acked_nodes: list[bytes] = []
        acked_constraint: list[int] = []
        max_version = 0
        stop = asyncio.Event()

        async def kv_writer(worker: int) -> None:
            i = 0
            while not stop.is_set():
                key = f"w{worker}-{i}".encode()
                try:
                    await stubs.kv.InternalKVPut(
                        G.InternalKVPutRequest(
                            namespace=b"crash", key=key, value=key * 4, overwrite=True
                        ),
                        timeout=RPC_TIMEOUT_S,
                    )
                except grpc.aio.AioRpcError:
                    return
                acked_keys.append(key)
                i += 1

        async def node_writer() -> None:
            i = 0
            while not stop.is_set():
                node_id = uuid.uuid4().bytes + i.to_bytes(12, "big")
                info = gcs_pb2.GcsNodeInfo(
                    node_id=node_id,
                    node_manager_address="127.0.0.1",
                    node_manager_port=1,
                    resources_total={"CPU": 1},
                    state=gcs_pb2.GcsNodeInfo.ALIVE,
                )
                try:
                    await stubs.node_info.RegisterNode(
                        G.RegisterNodeRequest(node_info=info), timeout=RPC_TIMEOUT_S
                    )
                except grpc.aio.AioRpcError:
                    return
                acked_nodes.append(node_id)
                i += 1

        async def constraint_and_state_writer() -> None:
            nonlocal max_version
            i = 1
            while not stop.is_set():
                constraint = A.ClusterResourceConstraint(
                    resource_requests=[
                        A.ResourceRequestByCount(
                            request=A.ResourceRequest(resources_bundle={"CPU": 1}), count=i
                        )
                    ]
                )
                try:
                    await stubs.autoscaler.RequestClusterResourceConstraint(
                        A.RequestClusterResourceConstraintRequest(
                            cluster_resource_constraint=constraint
                        ),
                        timeout=RPC_TIMEOUT_S,
                    )
                    acked_constraint.append(i)
                    state = await stubs.autoscaler.GetClusterResourceState(
                        A.GetClusterResourceStateRequest(), timeout=RPC_TIMEOUT_S
                    )
                except grpc.aio.AioRpcError:
                    return
                max_version = max(
                    max_version, state.cluster_resource_state.cluster_resource_state_version
                )
                i += 1

        tasks = [asyncio.create_task(kv_writer(w)) for w in range(4)]
        tasks += [
            asyncio.create_task(node_writer()),
            asyncio.create_task(constraint_and_state_writer()),
        ]
        # kill once every writer has had writes acknowledged (not after a fixed time: on a
        # loaded machine 1.5 s bought fewer than 50 acks)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while not (len(acked_keys) > 50 and acked_nodes and acked_constraint):
            assert loop.time() < deadline, "writers got no acknowledgements"
            assert not any(t.done() for t in tasks), "a writer stopped before the crash"
            await asyncio.sleep(0.05)
        gcs.kill9()
        stop.set()
        await asyncio.gather(*tasks)
        await channel.close()
        assert len(acked_keys) > 50 and acked_nodes and acked_constraint

        gcs.start()
        try:
            channel, after = await connect(gcs.address)
            assert after.cluster_id == stubs.cluster_id
            for start in range(0, len(acked_keys), 500):
                chunk = acked_keys[start : start + 500]
                got = await after.kv.InternalKVMultiGet(
                    G.InternalKVMultiGetRequest(namespace=b"crash", keys=chunk)
                )
                found = {e.key: e.value for e in got.results}
                missing = [k for k in chunk if found.get(k) != k * 4]
                assert not missing, f"acknowledged KV writes lost: {missing[:5]}"
            nodes = await after.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest())
            known = {n.node_id for n in nodes.node_info_list}
            assert set(acked_nodes) <= known
            state = (
                await after.autoscaler.GetClusterResourceState(A.GetClusterResourceStateRequest())
            ).cluster_resource_state
            assert state.cluster_resource_state_version > max_version
            count = state.cluster_resource_constraints[0].resource_requests[0].count
            assert count >= acked_constraint[-1]  # the last acked one, or one acked in flight
            await channel.close()
        finally:
            with contextlib.suppress(Exception):
                gcs.stop()
