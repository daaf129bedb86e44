"""The raylet agent's placement-group bundles: prepare holds, commit exposes Ray's bundle
resources, leases run against them, return / release give everything back."""

from __future__ import annotations

from gcs.policy.placement.naming import bundle_resources
from gcs.proto import common_pb2, node_manager_pb2
from gcs.raylet.resources import LeaseRequest, LocalResources, Placement

PG = bytes(range(18))
HEX = PG.hex()


def bundle(index: int, **unit: float) -> common_pb2.Bundle:
    out = common_pb2.Bundle(unit_resources=unit)
    out.bundle_id.placement_group_id = PG
    out.bundle_id.bundle_index = index
    return out


class TestNaming:
    def test_ray_names_for_a_bundle(self) -> None:
        """``CPU_group_<i>_<hex>``, ``CPU_group_<hex>`` and 1000 units of ``bundle_group_*``."""
        indexed, wildcard = bundle_resources(PG, 1, {"CPU": 2, "GPU": 0})
        assert indexed == {f"CPU_group_1_{HEX}": 2.0, f"bundle_group_1_{HEX}": 1000.0}
        assert wildcard == {f"CPU_group_{HEX}": 2.0, f"bundle_group_{HEX}": 1000.0}


class TestLocalAccounting:
    def test_prepare_holds_all_or_nothing(self) -> None:
        """Prepared resources leave ``available``; a set that does not fit takes nothing."""
        node = LocalResources({"CPU": 4})
        assert node.prepare_bundles([((PG, 0), {"CPU": 3})])
        assert node.available["CPU"] == 1 and node.busy
        assert not node.prepare_bundles([((PG, 1), {"CPU": 1}), ((PG, 2), {"CPU": 1})])
        assert node.available["CPU"] == 1 and set(node.bundles()) == {(PG, 0)}
        assert node.prepare_bundles([((PG, 0), {"CPU": 3})])  # a retry is idempotent
        assert node.available["CPU"] == 1

    def test_commit_exposes_bundle_resources_and_grants_waiting_leases(self) -> None:
        """A lease for ``CPU_group_0_<hex>`` is infeasible before the commit, granted after."""
        node = LocalResources({"CPU": 4})
        lease = LeaseRequest(b"l1", {f"CPU_group_0_{HEX}": 1, f"CPU_group_{HEX}": 1})
        assert node.submit(lease) is Placement.INFEASIBLE
        node.prepare_bundles([((PG, 0), {"CPU": 2}), ((PG, 1), {"CPU": 1})])
        granted = node.commit_bundles([(PG, 0), (PG, 1)])
        assert granted == [b"l1"]
        assert node.total[f"CPU_group_{HEX}"] == 3 and node.total[f"CPU_group_1_{HEX}"] == 1
        assert node.total[f"bundle_group_{HEX}"] == 2000
        assert node.available[f"CPU_group_0_{HEX}"] == 1 and node.available["CPU"] == 1
        assert node.total["CPU"] == 4
        assert node.commit_bundles([(PG, 0), (PG, 7)]) == []  # duplicate / unknown: skipped
        assert node.total[f"CPU_group_{HEX}"] == 3

    def test_return_evicts_leases_and_restores_the_node(self) -> None:
        """Returning a committed bundle frees its lease and removes its resources."""
        node = LocalResources({"CPU": 4})
        node.prepare_bundles([((PG, 0), {"CPU": 2})])
        node.commit_bundles([(PG, 0)])
        node.submit(LeaseRequest(b"l1", {f"CPU_group_0_{HEX}": 2}))
        evicted, _ = node.return_bundle((PG, 0))
        assert evicted == [b"l1"] and not node.busy
        assert node.total == {"CPU": 4} and node.available == {"CPU": 4}

    def test_release_unused_keeps_only_bundles_in_use(self) -> None:
        """After a GCS restart: prepared-only and unknown-to-the-GCS bundles go back."""
        node = LocalResources({"CPU": 4})
        node.prepare_bundles([((PG, 0), {"CPU": 1}), ((PG, 1), {"CPU": 1})])
        node.commit_bundles([(PG, 0)])
        node.prepare_bundles([((PG, 2), {"CPU": 1})])
        node.release_unused_bundles({(PG, 0)})
        assert node.bundles() == {(PG, 0): True} and node.available["CPU"] == 3


class TestOverTheWire:
    async def test_two_phase_rpcs_change_the_load_report(self, make_agent, node_manager) -> None:
        """Prepare / Commit / RemovePlacementGroupBundles over gRPC move GetResourceLoad."""
        agent = await make_agent(resources={"CPU": 4.0, "GPU": 1.0})
        stub = node_manager(agent)
        reply = await stub.PrepareBundleResources(
            node_manager_pb2.PrepareBundleResourcesRequest(bundle_specs=[bundle(0, GPU=1)])
        )
        assert reply.success
        again = await stub.PrepareBundleResources(
            node_manager_pb2.PrepareBundleResourcesRequest(bundle_specs=[bundle(1, GPU=1)])
        )
        assert not again.success
        await stub.CommitBundleResources(
            node_manager_pb2.CommitBundleResourcesRequest(bundle_specs=[bundle(0, GPU=1)])
        )
        load = (await stub.GetResourceLoad(node_manager_pb2.GetResourceLoadRequest())).resources
        assert load.resources_total[f"GPU_group_0_{HEX}"] == 1
        assert load.resources_available["GPU"] == 0
        assert load.idle_duration_ms == 0
        await stub.RemovePlacementGroupBundles(
            node_manager_pb2.RemovePlacementGroupBundlesRequest(
                placement_group_id=PG, bundle_specs=[bundle(0, GPU=1)]
            )
        )
        await stub.ReleaseUnusedBundles(node_manager_pb2.ReleaseUnusedBundlesRequest())
        load = (await stub.GetResourceLoad(node_manager_pb2.GetResourceLoadRequest())).resources
        assert dict(load.resources_total) == {"CPU": 4.0, "GPU": 1.0}
        assert dict(load.resources_available) == {"CPU": 4.0, "GPU": 1.0}
