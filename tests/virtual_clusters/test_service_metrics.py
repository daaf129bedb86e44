"""The virtual-cluster metric families count what ``gcs vcluster list`` counts."""

from __future__ import annotations

from collections import Counter

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID
from gcs.proto import virtual_cluster_pb2
from gcs.server.families import gcs_families

V = virtual_cluster_pb2


def _samples(env, name: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    [family] = [f for f in gcs_families(env.server.managers) if f.name == name]
    return {s.labels["virtual_cluster"]: s.value for s in family.samples}


class TestVirtualClusterNodeMetrics:
    async def test_dead_members_are_not_counted_as_nodes(self, memory_env) -> None:
        """Issue 27 item 4: with a dead member in a cluster and a dead node in the primary,
        gcs_virtual_cluster_nodes equals the node count of GetAllVirtualClusterInfo (what
        `vcluster list` and `status -v` show), for every cluster; the dead members a
        cluster still lists are gcs_virtual_cluster_dead_nodes."""
        env = memory_env
        created = await env.create("ind", {"4c8g": 2})
        member = sorted(created.node_instances)[0]
        spare = next(n for n in env.small if n not in created.node_instances)
        await env.kill(member)
        await env.kill(spare)

        reply = await env.vc.GetAllVirtualClusterInfo(V.GetAllVirtualClusterInfoRequest())
        listed = {v.id: len(v.node_instance_views) for v in reply.virtual_clusters_view}
        assert listed == {"ind": 1, PRIMARY_CLUSTER_ID: 2}
        assert _samples(env, "gcs_virtual_cluster_nodes") == listed
        assert _samples(env, "gcs_virtual_cluster_dead_nodes") == {
            "ind": 1,
            PRIMARY_CLUSTER_ID: 1,
        }

    async def test_every_count_of_a_cluster_agrees(self, memory_env) -> None:
        """The autoscaler's view of a cluster (virtual_cluster_states nodes) leaves out the
        same dead members the metric and the listing leave out."""
        env = memory_env
        created = await env.create("ind", {"8c16g": 2})
        await env.kill(sorted(created.node_instances)[1])
        registry = env.manager.registry
        states = registry.autoscaler_states()
        counts = registry.node_counts()
        assert {cid: len(s.nodes) for cid, s in states.items()} == {
            cid: alive for cid, (alive, _dead) in counts.items()
        }
        assert Counter(_samples(env, "gcs_virtual_cluster_nodes")) == Counter(
            {cid: alive for cid, (alive, _dead) in counts.items()}
        )
