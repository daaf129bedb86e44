"""InternalKV semantics, request validation, store outages and restart persistence."""

from __future__ import annotations

import grpc
import pytest

from gcs.base.clock import FakeClock
from gcs.proto import autoscaler_pb2 as A
from gcs.proto import common_pb2, gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.server import GcsServer
from tests.conftest import Stubs, fast_config


class TestInternalKV:
    async def test_put_get_exists_keys_delete(self, stubs) -> None:
        """Ray's KV semantics incl. added=false on overwrite and NotFound status in-reply."""
        kv = stubs.kv
        put = await kv.InternalKVPut(
            G.InternalKVPutRequest(namespace=b"ns", key=b"a/1", value=b"x", overwrite=False)
        )
        assert put.added
        put = await kv.InternalKVPut(
            G.InternalKVPutRequest(namespace=b"ns", key=b"a/1", value=b"y", overwrite=False)
        )
        assert not put.added
        assert (
            await kv.InternalKVGet(G.InternalKVGetRequest(namespace=b"ns", key=b"a/1"))
        ).value == b"x"
        await kv.InternalKVPut(
            G.InternalKVPutRequest(namespace=b"ns", key=b"a/2", value=b"z", overwrite=True)
        )
        await kv.InternalKVPut(G.InternalKVPutRequest(namespace=b"other", key=b"a/3", value=b"w"))
        keys = await kv.InternalKVKeys(G.InternalKVKeysRequest(namespace=b"ns", prefix=b"a/"))
        assert list(keys.results) == [b"a/1", b"a/2"]
        multi = await kv.InternalKVMultiGet(
            G.InternalKVMultiGetRequest(namespace=b"ns", keys=[b"a/1", b"missing"])
        )
        assert [(e.key, e.value) for e in multi.results] == [(b"a/1", b"x")]
        deleted = await kv.InternalKVDel(
            G.InternalKVDelRequest(namespace=b"ns", key=b"a/", del_by_prefix=True)
        )
        assert deleted.deleted_num == 2
        missing = await kv.InternalKVGet(G.InternalKVGetRequest(namespace=b"ns", key=b"a/1"))
        assert missing.status.code == 17 and missing.status.message == "Failed to find the key"
        exists = await kv.InternalKVExists(
            G.InternalKVExistsRequest(namespace=b"other", key=b"a/3")
        )
        assert exists.exists

    async def test_cluster_metadata_seeded_for_ray_clients(self, stubs) -> None:
        """Ray clients check CLUSTER_METADATA's ray_version and the autoscaler-v2 flag."""
        import json

        meta = await stubs.kv.InternalKVGet(
            G.InternalKVGetRequest(namespace=b"cluster", key=b"CLUSTER_METADATA")
        )
        assert json.loads(meta.value)["ray_version"] == "2.60.0"
        flag = await stubs.kv.InternalKVGet(
            G.InternalKVGetRequest(namespace=b"__autoscaler", key=b"__autoscaler_v2_enabled")
        )
        assert flag.value == b"1"
        cid = await stubs.kv.InternalKVGet(
            G.InternalKVGetRequest(namespace=b"cluster", key=b"ray_cluster_id")
        )
        assert cid.value == stubs.cluster_id

    async def test_empty_key_is_invalid(self, stubs) -> None:
        """An empty key names the field in INVALID_ARGUMENT."""
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs.kv.InternalKVPut(G.InternalKVPutRequest(key=b"", value=b"x"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "key" in info.value.details()


def _node(**kw) -> gcs_pb2.GcsNodeInfo:
    base = dict(
        node_id=b"\x01" * 28,
        node_manager_address="127.0.0.1",
        node_manager_port=1234,
        resources_total={"CPU": 1},
        state=gcs_pb2.GcsNodeInfo.ALIVE,
    )
    base.update(kw)
    return gcs_pb2.GcsNodeInfo(**base)


class TestRegisterValidation:
    @pytest.mark.parametrize(
        ("info", "needle"),
        [
            (_node(node_id=b""), "node_info.node_id is required"),
            (_node(node_id=b"\x01" * 5), "node_info.node_id must be 28 bytes"),
            (_node(node_id=b"\xff" * 28), "nil"),
            (_node(node_manager_address=""), "node_info.node_manager_address"),
            (_node(node_manager_port=0), "node_info.node_manager_port"),
            (_node(node_manager_port=70000), "node_info.node_manager_port"),
            (_node(resources_total={"CPU": -1}), "node_info.resources_total[CPU]"),
            (_node(resources_total={"CPU": float("nan")}), "node_info.resources_total[CPU]"),
            (_node(resources_total={"GPU": float("inf")}), "node_info.resources_total[GPU]"),
            (_node(resources_total={"": 1}), "empty resource name"),
            (_node(labels={"": "x"}), "node_info.labels"),
            (_node(resources_total={f"r{i}": 1 for i in range(100_001)}), "limit is 100000"),
            (_node(state=gcs_pb2.GcsNodeInfo.DEAD), "node_info.state"),
        ],
    )
    async def test_bad_node_info_is_rejected_without_a_write(
        self, gcs_server, stubs, info, needle
    ) -> None:
        """Each malformed field -> INVALID_ARGUMENT naming it; nothing is stored."""
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=info))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in err.value.details()
        assert not gcs_server.managers.nodes.alive
        assert not await gcs_server.store.get_all("NODE")

    async def test_a_node_with_rays_ten_thousand_custom_resources_registers(
        self, gcs_server, stubs
    ) -> None:
        """Ray's test_many_custom_resources: ``ray.init(resources=<10,000 custom>)`` is a
        node of 10,005 resources (old limit: 10,000, INVALID_ARGUMENT, the raylet never
        registered and ``ray.init`` timed out)."""
        resources = {str(i): float(1 + i % 6) for i in range(10_000)}
        resources.update({"CPU": 5, "memory": 1e9, "object_store_memory": 1e8})
        resources.update({"node:10.0.0.1": 1, "node:__internal_head__": 1})
        info = _node(resources_total=resources)
        await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=info))
        stored = gcs_server.managers.nodes.alive[info.node_id]
        assert len(stored.resources_total) == 10_005

    async def test_unknown_enum_in_filters_is_invalid(self, stubs) -> None:
        """A state_filter outside the enum is INVALID_ARGUMENT, not an empty list."""
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stubs.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest(state_filter=7))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "state_filter" in err.value.details()

    async def test_unregister_with_unknown_reason_is_invalid(self, stubs) -> None:
        """node_death_info.reason must be a known enum value."""
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stubs.node_info.UnregisterNode(
                G.UnregisterNodeRequest(
                    node_id=b"\x01" * 28, node_death_info=common_pb2.NodeDeathInfo(reason=42)
                )
            )
        assert "node_death_info.reason" in err.value.details()


class TestStoreOutage:
    async def test_writes_fail_unavailable_and_nothing_is_acknowledged(
        self, gcs_server, stubs, memory_store
    ) -> None:
        """With the store down, RegisterNode is UNAVAILABLE and the node is not in memory;
        after recovery the same call succeeds."""
        memory_store.fail_writes = True
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=_node()))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not gcs_server.managers.nodes.alive
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stubs.autoscaler.RequestClusterResourceConstraint(
                A.RequestClusterResourceConstraintRequest()
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert gcs_server.managers.autoscaler.constraint is None
        memory_store.fail_writes = False
        await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=_node()))
        assert gcs_server.managers.nodes.alive


class TestRestart:
    async def test_state_survives_a_restart_on_the_same_store(self, memory_store) -> None:
        """Nodes, constraint, cluster id, job counter and versions come back; versions only
        go forward."""
        first = GcsServer(fast_config(), store=memory_store)
        await first.start()
        async with grpc.aio.insecure_channel(first.address) as ch:
            s = Stubs(ch, first.meta.cluster_id)
            await s.node_info.RegisterNode(G.RegisterNodeRequest(node_info=_node()))
            await s.autoscaler.RequestClusterResourceConstraint(
                A.RequestClusterResourceConstraintRequest(
                    cluster_resource_constraint=A.ClusterResourceConstraint(
                        resource_requests=[
                            A.ResourceRequestByCount(
                                request=A.ResourceRequest(resources_bundle={"CPU": 1}), count=4
                            )
                        ]
                    )
                )
            )
            for _ in range(3):
                v1 = (
                    await s.autoscaler.GetClusterResourceState(A.GetClusterResourceStateRequest())
                ).cluster_resource_state
            job1 = (await s.jobs.GetNextJobID(G.GetNextJobIDRequest())).job_id
        await first.stop()

        second = GcsServer(fast_config(), store=memory_store)
        await second.start()
        try:
            assert second.meta.cluster_id == first.meta.cluster_id
            async with grpc.aio.insecure_channel(second.address) as ch:
                s = Stubs(ch, second.meta.cluster_id)
                v2 = (
                    await s.autoscaler.GetClusterResourceState(A.GetClusterResourceStateRequest())
                ).cluster_resource_state
                assert v2.cluster_resource_state_version > v1.cluster_resource_state_version
                assert v2.cluster_resource_constraints[0].resource_requests[0].count == 4
                assert [n.node_id for n in v2.node_states] == [b"\x01" * 28]
                job2 = (await s.jobs.GetNextJobID(G.GetNextJobIDRequest())).job_id
                assert job2 == job1 + 1
        finally:
            await second.stop()

    @pytest.mark.parametrize("backend", ["sqlite", "redis"])
    async def test_state_survives_restart_on_durable_stores(
        self, backend, tmp_path, request
    ) -> None:
        """On the embedded SQLite store and on Redis, a new server process-equivalent (fresh
        store object, same URL) gets back nodes, constraint, cluster id and versions."""
        import uuid

        from gcs.store import store_from_url

        if backend == "sqlite":
            url = f"sqlite:///{tmp_path}/gcs.sqlite3"
        else:
            url = request.getfixturevalue("redis_server").url
        namespace = f"restart-{uuid.uuid4().hex[:8]}"
        versions = []
        cluster_ids = []
        for round_ in range(2):
            store = store_from_url(url, namespace=namespace)
            server = GcsServer(fast_config(), store=store)
            await store.open()
            await server.start()
            try:
                cluster_ids.append(server.meta.cluster_id)
                async with grpc.aio.insecure_channel(server.address) as ch:
                    s = Stubs(ch, server.meta.cluster_id)
                    if round_ == 0:
                        await s.node_info.RegisterNode(G.RegisterNodeRequest(node_info=_node()))
                        await s.autoscaler.RequestClusterResourceConstraint(
                            A.RequestClusterResourceConstraintRequest(
                                cluster_resource_constraint=A.ClusterResourceConstraint(
                                    resource_requests=[
                                        A.ResourceRequestByCount(
                                            request=A.ResourceRequest(resources_bundle={"GPU": 1}),
                                            count=2,
                                        )
                                    ]
                                )
                            )
                        )
                    state = (
                        await s.autoscaler.GetClusterResourceState(
                            A.GetClusterResourceStateRequest()
                        )
                    ).cluster_resource_state
                    versions.append(state.cluster_resource_state_version)
                    assert [n.node_id for n in state.node_states] == [b"\x01" * 28]
                    assert state.cluster_resource_constraints[0].resource_requests[0].count == 2
            finally:
                await server.stop()
                await store.close()
        assert cluster_ids[0] == cluster_ids[1]
        assert versions[1] > versions[0]

    async def test_node_that_died_while_gcs_was_down_is_detected(self, memory_store) -> None:
        """A node restored from the store but unreachable is marked dead by health checks."""
        first = GcsServer(fast_config(), store=memory_store)
        await first.start()
        async with grpc.aio.insecure_channel(first.address) as ch:
            s = Stubs(ch, first.meta.cluster_id)
            await s.node_info.RegisterNode(
                G.RegisterNodeRequest(node_info=_node(node_manager_port=1))
            )
        await first.stop()
        clock = FakeClock()  # the second GCS's health checks move only with the test
        second = GcsServer(fast_config(), store=memory_store, clock=clock)
        await second.start()
        try:
            assert b"\x01" * 28 in second.managers.nodes.alive  # no check is due yet
            await clock.advance_until(lambda: not second.managers.nodes.alive, step_s=0.1)
            assert b"\x01" * 28 in second.managers.nodes.dead
            assert second.managers.health.failures == fast_config().health.failure_threshold
        finally:
            await second.stop()
