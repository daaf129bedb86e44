"""Unmodified Ray 2.60 clients (own virtualenv, subprocess) against our GCS.

`GcsClient` reads our state with raylets in it; `ray.autoscaler.v2.sdk.request_cluster_resources`
sets a constraint we then report; `get_cluster_status` parses; `GcsClient.drain_node` is
forwarded to the raylet and its answer comes back.
"""

from __future__ import annotations

import asyncio
import json
import textwrap

import pytest

from tests.interop import venvs

pytestmark = pytest.mark.interop

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from ray._raylet import GcsClient
    from ray.autoscaler.v2 import sdk

    address, busy_hex, idle_hex = sys.argv[1:4]
    client = GcsClient(address=address)
    nodes = client.get_all_node_info()
    state = sdk.get_cluster_resource_state(client)
    sdk.request_cluster_resources(address, [{"resources": {"CPU": 1}, "label_selector": {}}] * 3
        + [{"resources": {"GPU": 1}, "label_selector": {"zone": "in(a,b)"}}])
    status = sdk.get_cluster_status(address)
    rejected = client.drain_node(busy_hex, 1, "idle termination", 0)
    accepted = client.drain_node(idle_hex, 2, "spot preemption", 0)
    print(json.dumps({
        "nodes": {k.hex(): v.node_type_name for k, v in nodes.items()},
        "statuses": sorted(n.status for n in state.node_states),
        "pending": sorted((json.dumps(dict(r.request.resources_bundle), sort_keys=True),
                           r.count) for r in state.pending_resource_requests),
        "version": state.cluster_resource_state_version,
        "status_active": sorted(n.ray_node_type_name for n in status.active_nodes),
        "status_idle": sorted(n.ray_node_type_name for n in status.idle_nodes),
        "rejected": list(rejected),
        "accepted": list(accepted),
    }))
    """
)


def run_script(venv: venvs.Venv, *args: str) -> dict:
    script = f"import sys; sys.argv = ['x', {', '.join(repr(a) for a in args)}]\n" + CLIENT_SCRIPT
    return venvs.run_in_venv(venv, script, timeout=120)


class TestRay260Clients:
    async def test_gcs_client_sdk_status_and_drain(self, ray_venv, gcs_server, stubs) -> None:
        """Ray's own client reads nodes and demand, sets a constraint, parses the status and
        gets the raylet's drain answers."""
        from gcs.raylet.agent import RayletAgent, RayletConfig
        from gcs.raylet.workload import TaskSpec, submit
        from tests.conftest import eventually

        address = gcs_server.address
        busy = RayletAgent(
            RayletConfig(gcs_address=address, node_type="cpu4", resources={"CPU": 4.0, "work": 2.0})
        )
        idle = RayletAgent(
            RayletConfig(gcs_address=address, node_type="gpu", resources={"CPU": 8.0, "GPU": 1.0})
        )
        for agent in (busy, idle):
            await agent.start()
        try:
            # Two leases run on the busy node, a third waits there: real demand.
            result = await submit(address, TaskSpec({"work": 1.0}, 300.0), 3, detach=True)
            assert result.granted == 2 and result.queued == 1
            cache = gcs_server.managers.resources

            def polled() -> bool:
                busy_entry, idle_entry = (
                    cache.nodes.get(busy.node_id),
                    cache.nodes.get(idle.node_id),
                )
                return bool(
                    busy_entry
                    and idle_entry
                    and len(cache.demand)
                    and idle_entry.data.idle_duration_ms > 0
                )

            # wall clock: the GCS's load polls of two agents over real gRPC (demand, idle time)
            await eventually(polled, timeout_s=60)
            out = await asyncio.to_thread(
                run_script, ray_venv, address, busy.node_id.hex(), idle.node_id.hex()
            )
        finally:
            await busy.stop()
            await idle.stop()
        assert out["nodes"] == {busy.node_id.hex(): "cpu4", idle.node_id.hex(): "gpu"}
        assert out["statuses"] == [1, 3]  # RUNNING, IDLE
        assert out["pending"] == [[json.dumps({"work": 1.0}), 1]]
        assert out["status_active"] == ["cpu4"] and out["status_idle"] == ["gpu"]
        assert out["rejected"] == [False, "The node to be idle terminated is no longer idle."]
        assert out["accepted"][0] is True
        constraint = gcs_server.managers.autoscaler.constraint
        assert constraint is not None
        got = {
            tuple(sorted(r.request.resources_bundle)): (
                dict(r.request.resources_bundle),
                r.count,
                [
                    sorted(c.label_values)
                    for s in r.request.label_selectors
                    for c in s.label_constraints
                ],
            )
            for r in constraint.resource_requests
        }
        assert got[("CPU",)] == ({"CPU": 1.0}, 3, [])
        assert got[("GPU",)] == ({"GPU": 1.0}, 1, [["a", "b"]])
        state = await gcs_server.managers.autoscaler.cluster_resource_state()
        assert state.cluster_resource_constraints[0] == constraint
        assert state.cluster_resource_state_version > out["version"]
