"""What a newcomer hit (issue 20), each against a real in-process GCS: health of a service
that is not served, `status --watch | head`, a virtual cluster too big for the nodes, and
`gcs submit` of work no node type can hold."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import pytest
from click.testing import CliRunner, Result

from gcs.cli.main import main
from gcs.policy.autoscaling.scheduler import waiting
from gcs.policy.autoscaling.scheduler.waiting import WaitingDemand, WaitKind, WaitReason
from gcs.proto import autoscaler_pb2, gcs_service_pb2
from gcs.raylet.agent import RayletAgent, RayletConfig
from gcs.rpc.descriptors import AUTOSCALER_STATE, INTERNAL_KV
from gcs.sdk import AsyncGcsClient
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import fast_config


async def _cli(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, main, list(args))


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[GcsServer, RayletAgent]]:
    server = GcsServer(fast_config(), store=MemoryStore())
    await server.start()
    agent = RayletAgent(
        RayletConfig(gcs_address=server.address, resources={"CPU": 4.0}, node_type="cpu4")
    )
    try:
        await agent.start()
        yield server, agent
    finally:
        await agent.stop()
        await server.stop()


class TestHealth:
    async def test_a_service_that_is_not_served_is_one_readable_line(
        self, cluster: tuple[GcsServer, RayletAgent]
    ) -> None:
        """NOT_FOUND names the service and the address and says what to do (it printed
        "Error: NOT_FOUND:" and nothing else)."""
        server, _ = cluster
        result = await _cli("health", "--address", server.address, "--service", "ray.rpc.Nope")
        assert result.exit_code == 1
        line = result.stderr.strip()
        assert "\n" not in line and "Traceback" not in result.output
        assert f"the GCS at {server.address} does not serve 'ray.rpc.Nope' (NOT_FOUND)" in line
        assert "leave --service out" in line

    async def test_a_served_service_is_serving(
        self, cluster: tuple[GcsServer, RayletAgent]
    ) -> None:
        server, _ = cluster
        args = ("health", "--address", server.address, "--service", "ray.rpc.NodeInfoGcsService")
        result = await _cli(*args, "--format", "json")
        assert result.exit_code == 0 and result.stdout.strip() == '{"status": "SERVING"}'


class TestStatusWatchIntoHead:
    async def test_a_closed_pipe_ends_quietly_with_0(
        self, cluster: tuple[GcsServer, RayletAgent]
    ) -> None:
        """`gcs status --watch | head -1`: once the reader is gone the next redraw ends the
        command with exit 0 and nothing on stderr (it said "Error: Broken pipe", exit 1)."""
        server, _ = cluster
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gcs", "status", "--watch", "--interval", "0.1",
            "--address", server.address,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        try:
            first = await asyncio.wait_for(proc.stdout.readline(), 120)
            assert first  # one line read, as `head -1` does; then the reader goes away
            proc._transport.get_pipe_transport(1).close()  # type: ignore[attr-defined]
            stderr = await asyncio.wait_for(proc.stderr.read(), 120)
            code = await asyncio.wait_for(proc.wait(), 120)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert (code, stderr) == (0, b"")


class TestVirtualClusterCreate:
    async def test_too_many_nodes_shows_the_recommended_replica_sets(
        self, cluster: tuple[GcsServer, RayletAgent]
    ) -> None:
        """The GCS recommends what it can add; the line shows it (it promised "shown below"
        and showed nothing)."""
        server, _ = cluster
        result = await _cli(
            "vcluster", "create", "--id", "team-a", "--replica-sets", '{"cpu4": 5}',
            "--address", server.address,
        )  # fmt: skip
        assert result.exit_code == 1, result.output
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("Error: Failed to create virtual cluster 'team-a': No enough nodes")
        assert line.endswith('Recommended replica sets: {"cpu4": 1}')

    async def test_the_server_refuses_an_id_that_breaks_the_rule(
        self, cluster: tuple[GcsServer, RayletAgent]
    ) -> None:
        """A client other than ours (ant-ray's CLI, the SDK) gets the rule from the GCS."""
        from gcs.sdk._vcluster_client import VirtualClusterCallError, VirtualClusterClient

        server, _ = cluster
        async with VirtualClusterClient(server.address) as client:
            with pytest.raises(VirtualClusterCallError) as caught:
                await client.create_or_update("bad id/x", replica_sets={})
        assert caught.value.message == (
            "Invalid request, virtual cluster id 'bad id/x' is invalid: use letters, digits, "
            "'-', '_' and '.', starting with a letter or digit ('/' breaks ant-ray's dashboard "
            "URLs, '##' marks job clusters, spaces break the CLI)."
        )


async def _report_waiting(address: str, shape: dict[str, float], reason: WaitReason) -> None:
    """What our autoscaler publishes each round; Ray's wire list says infeasible either way
    (Ray counts a limit as infeasible)."""
    state = autoscaler_pb2.AutoscalingState(autoscaler_state_version=1)
    state.infeasible_resource_requests.add(resources_bundle=shape)
    doc = waiting.to_json(
        [WaitingDemand(WaitKind.TASKS, shape, 2, reason, "the autoscaler's why")], at_s=1.0
    )
    async with AsyncGcsClient(address) as client:
        await client.call(
            AUTOSCALER_STATE,
            "ReportAutoscalingState",
            autoscaler_pb2.ReportAutoscalingStateRequest(autoscaling_state=state),
        )
        await client.call(
            INTERNAL_KV,
            "InternalKVPut",
            gcs_service_pb2.InternalKVPutRequest(
                namespace=b"gcs_autoscaler", key=b"waiting", value=doc, overwrite=True
            ),
        )


class TestSubmitInfeasible:
    async def test_the_autoscalers_verdict_ends_the_wait(
        self, cluster: tuple[GcsServer, RayletAgent]
    ) -> None:
        """`--resources '{"FOO": 1}'` with no --timeout: a warning at once, then, as the
        autoscaler lists the shape as infeasible, exit 1 with the tasks withdrawn (it used
        to wait silently forever)."""
        server, agent = cluster
        await _report_waiting(server.address, {"FOO": 1.0}, WaitReason.INFEASIBLE)
        result = await _cli(
            "submit", "--resources", '{"FOO": 1}', "--count", "2", "--address", server.address
        )
        assert result.exit_code == 1, result.output
        warning, error = result.stderr.strip().splitlines()
        assert warning.startswith('Warning: 2 of 2 tasks of {"FOO": 1.0} fit no alive node')
        assert error == (
            'Error: 2 of 2 tasks of {"FOO": 1.0} cannot start: the autoscaler finds no node '
            "type that fits them; they were withdrawn"
        )
        assert "abandoned 2" in result.stdout
        _, rows = agent.resources.load()
        assert sum(r.ready + r.infeasible for r in rows) == 0  # nothing left as demand

    async def test_capped_tasks_are_kept(self, cluster: tuple[GcsServer, RayletAgent]) -> None:
        """A shape a node type fits but its max_workers holds back is kept waiting (3 x
        {CPU: 2} with one cpu2 allowed were all withdrawn, the wire list calling them
        infeasible): here --timeout ends the wait, exit 3, nothing abandoned."""
        server, _ = cluster
        await _report_waiting(server.address, {"FOO": 1.0}, WaitReason.CAPPED)
        result = await _cli(
            "submit", "--resources", '{"FOO": 1}', "--count", "2", "--timeout", "1.5",
            "--address", server.address,
        )  # fmt: skip
        assert result.exit_code == 3, result.output
        assert "abandoned 0" in result.stdout
        assert "timed_out 2" in result.stdout

    def test_no_autoscaler_no_verdict(self) -> None:
        """Without a published verdict nobody can say the shape is hopeless; a verdict is
        final only when every entry for the shape outside virtual clusters says infeasible."""
        from gcs.raylet.infeasible import autoscaler_verdict

        def entry(reason: WaitReason, cluster: str = "") -> WaitingDemand:
            return WaitingDemand(WaitKind.TASKS, {"FOO": 1.0}, 1, reason, "why", cluster)

        assert not autoscaler_verdict(None, {"FOO": 1.0})
        assert autoscaler_verdict((entry(WaitReason.INFEASIBLE),), {"FOO": 1.0, "CPU": 0.0})
        assert not autoscaler_verdict((entry(WaitReason.INFEASIBLE),), {"FOO": 2.0})
        both = (entry(WaitReason.INFEASIBLE), entry(WaitReason.PENDING_CAPACITY))
        assert not autoscaler_verdict(both, {"FOO": 1.0})
        tenant = (entry(WaitReason.INFEASIBLE, "team-a"),)
        assert not autoscaler_verdict(tenant, {"FOO": 1.0})
