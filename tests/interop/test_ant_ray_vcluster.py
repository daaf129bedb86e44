"""The unmodified ant-ray 2.44.1.1 `ray vcluster` CLI (own virtualenv) against our GCS.

Raylets of two node types are registered; the CLI creates, lists, updates with the right and
with a stale revision, and removes a virtual cluster.  Revisions are read with the wheel's own
generated gRPC stubs (the CLI does not print them).
"""

from __future__ import annotations

import asyncio
import json
import textwrap

import pytest

from tests.interop import venvs
from tests.interop.ray_processes import ray_env

pytestmark = pytest.mark.interop

GET_SCRIPT = textwrap.dedent(
    """
    import grpc, json, sys
    from ray.core.generated import gcs_service_pb2 as g, gcs_service_pb2_grpc as gg
    stub = gg.VirtualClusterInfoGcsServiceStub(grpc.insecure_channel(sys.argv[1]))
    reply = stub.GetVirtualClusters(g.GetVirtualClustersRequest(virtual_cluster_id=sys.argv[2]))
    print(json.dumps({"code": reply.status.code, "clusters": [
        {"id": d.id, "revision": d.revision, "divisible": d.divisible,
         "templates": sorted(n.template_id for n in d.node_instances.values())}
        for d in reply.virtual_cluster_data_list]}))
    """
)


async def ray_cli(venv: venvs.Venv, *args: str) -> tuple[int, str]:
    env = ray_env(None)
    # Ray's CLI rewrites 127.0.0.1 to the host's primary IP unless told not to
    # (gcs-server.md §7.3); our test server listens on loopback only.
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    proc = await asyncio.create_subprocess_exec(
        str(venv.path / "bin" / "ray"),
        "vcluster",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode or 0, out.decode(errors="replace")


async def get_clusters(venv: venvs.Venv, address: str, cluster_id: str) -> dict:
    script = f"import sys; sys.argv = ['x', {address!r}, {cluster_id!r}]\n" + GET_SCRIPT
    return await asyncio.to_thread(venvs.run_in_venv, venv, script, timeout=60)


class TestAntRayVclusterCli:
    async def test_create_list_update_stale_update_remove(self, ant_ray_venv, gcs_server) -> None:
        """The whole lifecycle through ant-ray's CLI, with its own success/failure lines."""
        from gcs.raylet.agent import RayletAgent, RayletConfig

        address = gcs_server.address
        raylets = [
            RayletAgent(
                RayletConfig(gcs_address=address, node_type=node_type, resources={"CPU": cpus})
            )
            for node_type, cpus, count in (("4c8g", 4.0, 3), ("8c16g", 8.0, 2))
            for _ in range(count)
        ]
        for raylet in raylets:
            await raylet.start()
        try:
            rc, out = await ray_cli(
                ant_ray_venv,
                "create",
                "--address",
                address,
                "--id",
                "vc1",
                "--replica-sets",
                json.dumps({"4c8g": 2, "8c16g": 1}),
            )
            assert rc == 0 and "Virtual cluster 'vc1' created successfully" in out, out

            rc, out = await ray_cli(ant_ray_venv, "list", "--address", address, "--format", "json")
            assert rc == 0, out
            rows = {r["virtual_cluster_id"]: r for r in json.loads(out[out.index("[") :])}
            assert rows["vc1"]["replica_sets"] == {"4c8g": 2, "8c16g": 1}
            assert rows["kPrimaryClusterID"]["undivided_replica_sets"] == {"4c8g": 1, "8c16g": 1}

            first = (await get_clusters(ant_ray_venv, address, "vc1"))["clusters"][0]
            rc, out = await ray_cli(
                ant_ray_venv,
                "update",
                "--address",
                address,
                "--id",
                "vc1",
                "--replica-sets",
                json.dumps({"4c8g": 3, "8c16g": 1}),
                "--revision",
                str(first["revision"]),
            )
            assert rc == 0 and "Virtual cluster 'vc1' updated successfully" in out, out
            second = (await get_clusters(ant_ray_venv, address, "vc1"))["clusters"][0]
            assert second["revision"] > first["revision"]
            assert second["templates"] == ["4c8g", "4c8g", "4c8g", "8c16g"]

            rc, out = await ray_cli(
                ant_ray_venv,
                "update",
                "--address",
                address,
                "--id",
                "vc1",
                "--replica-sets",
                json.dumps({"4c8g": 1}),
                "--revision",
                str(first["revision"]),
            )
            assert "Failed to update virtual cluster 'vc1'" in out, out
            assert f"The revision ({first['revision']}) is expired" in out
            unchanged = (await get_clusters(ant_ray_venv, address, "vc1"))["clusters"][0]
            assert unchanged == second

            rc, out = await ray_cli(ant_ray_venv, "remove", "--address", address, "vc1")
            assert rc == 0 and "Virtual cluster 'vc1' removed successfully" in out, out
            assert (await get_clusters(ant_ray_venv, address, "vc1"))["clusters"] == []
        finally:
            for raylet in raylets:
                await raylet.stop()
