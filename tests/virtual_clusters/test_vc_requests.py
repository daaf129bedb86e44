"""Issue 27 item 8: a virtual-cluster request's refusal names the mistake it is about.

An update of a missing cluster is NotFound (never a create), an unknown node type is named
with the known ones, a request the embedded autoscaler can fill is accepted and waits for
it, and `gcs vcluster update` keeps the cluster's divisibility.  ant-ray's wire behaviour
stays for ant-ray's clients (no ``must_exist``: create-or-update; the same code, message
and recommendation for a shortfall)."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

from gcs.autoscaler.config import parse_cluster_config
from gcs.cli.vcluster import vcluster
from gcs.policy.virtual_clusters import VcError, VcStatusCode
from gcs.policy.virtual_clusters.launchable import Launchable
from gcs.policy.virtual_clusters.messages import NO_ENOUGH_TO_ADD
from gcs.policy.virtual_clusters.model import floor
from gcs.proto import virtual_cluster_pb2
from gcs.server.extras import Extras, launchable_of
from tests.virtual_clusters.conftest import Harness

V = virtual_cluster_pb2
ROOM = Launchable({"0": 14, "1": 10})
"""An autoscaler that may run 14 nodes of type "0" (the harness has 10) and 10 of "1"."""


async def cli(*args: str):  # type: ignore[no-untyped-def]
    return await asyncio.to_thread(CliRunner().invoke, vcluster, list(args))


@pytest.fixture
def h() -> Harness:
    return Harness(20, 2)


class TestUpdateOfAMissingCluster:
    def test_must_exist_is_not_found_naming_the_id(self, h: Harness) -> None:
        """An update (``must_exist``) of a missing cluster is NotFound and creates nothing,
        whatever the replica sets (empty ones used to create it silently)."""
        for replica_sets in ({}, {"0": 1}, {"cpu4": 1}):
            with pytest.raises(VcError) as info:
                h.registry.create_or_update("nope", False, replica_sets, 0, must_exist=True)
            assert info.value.code is VcStatusCode.NotFound
            assert info.value.message == "Virtual cluster nope does not exist."
            assert h.registry.get("nope") is None

    def test_without_must_exist_ant_rays_create_or_update_creates(self, h: Harness) -> None:
        """ant-ray's clients do not send the extension: CreateOrUpdate creates, as theirs."""
        h.run(h.registry.create_or_update("new", False, {}, 12345))
        assert h.registry.get("new") is not None


class TestUnknownNodeTypes:
    def test_an_unknown_type_is_named_with_the_known_ones(self, h: Harness) -> None:
        """ant-ray's code, message and recommendation stay (its dashboard tests look for
        "No enough nodes to add"); the message starts with the unknown type."""
        with pytest.raises(VcError) as info:
            h.registry.create_or_update("v", True, {"nosuchtype": 1, "0": 1}, 0)
        err = info.value
        assert err.code is VcStatusCode.OutOfResource
        assert err.message == (
            "Unknown node type nosuchtype: no node of it has joined and no autoscaler can "
            f"launch one (known node types: 0, 1). {NO_ENOUGH_TO_ADD}"
        )
        assert err.replica_sets_to_recommend == {"nosuchtype": 0, "0": 1}

    def test_a_type_the_autoscaler_can_launch_is_known(self, h: Harness) -> None:
        """A type no node has yet, but the autoscaler may launch, is not "unknown"."""
        room = Launchable({"gpu1": 2})
        with pytest.raises(VcError) as info:
            h.registry.create_or_update("v", True, {"gpu1": 1}, 0, launchable=room)
        assert info.value.message.startswith(NO_ENOUGH_TO_ADD)  # divisible: not filled
        h.run(h.registry.create_or_update("w", False, {"gpu1": 1}, 0, launchable=room))
        assert floor(h.registry.get("w")) == {"gpu1": 1}


class TestWaitingForTheAutoscaler:
    def test_an_indivisible_request_within_the_autoscalers_room_is_accepted(
        self, h: Harness
    ) -> None:
        """12 x "0" with 10 free: accepted with the 10, the 12 declared (the floor the
        autoscaler fills); without an autoscaler it is refused as before."""
        with pytest.raises(VcError) as info:
            h.registry.create_or_update("v", False, {"0": 12}, 0)
        assert info.value.code is VcStatusCode.OutOfResource
        assert info.value.replica_sets_to_recommend == {"0": 10}
        h.run(h.registry.create_or_update("v", False, {"0": 12}, 0, launchable=ROOM))
        cluster = h.registry.get("v")
        assert len(cluster.members) == 10 and floor(cluster) == {"0": 12}
        assert dict(h.registry.autoscaler_states()["v"].min_replica_sets) == {"0": 12}
        h.sound()

    def test_room_counts_what_other_clusters_wait_for(self, h: Harness) -> None:
        """max_workers 14 of "0": v waits for 2, so w may wait for 2 more, not 3."""
        h.run(h.registry.create_or_update("v", False, {"0": 12}, 0, launchable=ROOM))
        with pytest.raises(VcError, match="No enough nodes to add"):
            h.registry.create_or_update("w", False, {"0": 3}, 0, launchable=ROOM)
        h.run(h.registry.create_or_update("w", False, {"0": 2}, 0, launchable=ROOM))
        assert h.registry.get("w").members == {}

    def test_the_cluster_node_cap_is_kept(self, h: Harness) -> None:
        """max_num_nodes 21 (20 alive): 1 more node may be waited for, not 2."""
        capped = Launchable({"0": 14}, max_nodes=21)
        with pytest.raises(VcError):
            h.registry.create_or_update("v", False, {"0": 12}, 0, launchable=capped)
        h.run(h.registry.create_or_update("v", False, {"0": 11}, 0, launchable=capped))

    def test_divisible_clusters_and_autoscaler_moves_are_never_short(self, h: Harness) -> None:
        """The autoscaler scales indivisible clusters only, and its own moves are exact."""
        with pytest.raises(VcError) as info:
            h.registry.create_or_update("d", True, {"0": 12}, 0, launchable=ROOM)
        assert info.value.message.startswith(NO_ENOUGH_TO_ADD)
        assert info.value.message.endswith(
            "it fills indivisible clusters only: create this "
            "one indivisible, or with the nodes that are free."
        )
        h.create("i", {"0": 1}, divisible=False)
        rev = h.registry.get("i").revision
        with pytest.raises(VcError):
            h.registry.create_or_update(
                "i", False, {"0": 12}, rev, autoscaler=True, launchable=ROOM
            )

    def test_the_embedded_autoscalers_limits_leave_out_the_head(self) -> None:
        """``gcs serve --autoscaler-config``: worker types with max_workers, the node cap."""
        cluster = parse_cluster_config(
            {
                "head_node_type": "head",
                "max_workers": 6,
                "provider": {"type": "read-only"},
                "available_node_types": {
                    "head": {"resources": {"CPU": 0}, "max_workers": 0},
                    "cpu4": {"resources": {"CPU": 4}, "max_workers": 3},
                },
            }
        )
        limits = launchable_of(Extras(autoscaler=cluster))
        assert dict(limits.max_workers) == {"cpu4": 3}
        assert limits.max_nodes == cluster.scheduler.max_num_nodes
        assert launchable_of(Extras()) == Launchable()


class TestTheCli:
    async def test_update_of_a_missing_cluster_says_so_and_creates_nothing(
        self, memory_env
    ) -> None:
        """`update --id nope` answered "No enough nodes ... {"cpu4": 0}", and with '{}'
        created the cluster."""
        address = memory_env.server.address
        for sets in ('{"cpu4": 1}', "{}"):
            result = await cli(
                "update", "--id", "nope", "--replica-sets", sets, "--revision", "0",
                "--address", address,
            )  # fmt: skip
            assert result.exit_code == 1, result.output
            assert (
                "Failed to update virtual cluster 'nope': virtual cluster 'nope' does not "
                "exist (create it with `gcs vcluster create --id nope`)"
            ) in result.output
            assert "No enough nodes" not in result.output
        assert await memory_env.clusters() == {}

    async def test_the_wire_extension_refuses_a_removed_cluster(self, memory_env) -> None:
        """What the CLI sends: ``must_exist`` answers NotFound in the reply status."""
        reply = await memory_env.vc.CreateOrUpdateVirtualCluster(
            V.CreateOrUpdateVirtualClusterRequest(virtual_cluster_id="gone", must_exist=True)
        )
        assert (reply.status.code, reply.status.message) == (
            17,
            "Virtual cluster gone does not exist.",
        )
        assert await memory_env.clusters() == {}

    async def test_create_with_an_unknown_type_names_it(self, memory_env) -> None:
        address = memory_env.server.address
        result = await cli(
            "create", "--id", "vc1", "--replica-sets", '{"nosuchtype": 1}', "--address", address
        )
        assert result.exit_code == 1
        assert (
            "Failed to create virtual cluster 'vc1': Unknown node type nosuchtype: no node of "
            "it has joined and no autoscaler can launch one (known node types: 4c8g, 8c16g)."
        ) in result.output

    async def test_update_keeps_the_clusters_divisibility(self, memory_env) -> None:
        """Without --divisible a divisible cluster is updated (it answered "incompatible...
        expect: (1), actual: (0)."); asking to flip it says why in words."""
        address = memory_env.server.address
        created = await cli(
            "create", "--id", "d", "--divisible", "--replica-sets", '{"4c8g": 1}',
            "--format", "json", "--address", address,
        )  # fmt: skip
        assert created.exit_code == 0, created.output
        revision = str(json.loads(created.stdout)["revision"])
        flipped = await cli(
            "update", "--id", "d", "--indivisible", "--replica-sets", '{"4c8g": 2}',
            "--revision", revision, "--address", address,
        )  # fmt: skip
        assert flipped.exit_code == 1
        assert (
            "Failed to update virtual cluster 'd': virtual cluster 'd' is divisible, and "
            "divisibility is fixed when a cluster is created: leave out --indivisible"
        ) in flipped.output
        kept = await cli(
            "update", "--id", "d", "--replica-sets", '{"4c8g": 2}', "--revision", revision,
            "--address", address,
        )  # fmt: skip
        assert kept.exit_code == 0, kept.output
        assert (await memory_env.clusters())["d"].divisible
