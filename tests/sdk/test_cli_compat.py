"""The ``gcs`` CLI's status / request-resources commands drive this SDK end to end."""

from __future__ import annotations

import asyncio

from click.testing import CliRunner

from gcs.cli.main import main
from gcs.proto import autoscaler_pb2
from gcs.testing.recording_gcs import RecordingGcs


class TestCliUsesSdk:
    async def test_request_resources_command_sends_one_constraint(self) -> None:
        """`gcs request-resources --num-cpus 2 --bundles ...` reaches the GCS as one call."""
        async with RecordingGcs() as gcs:
            args = ["request-resources", "--address", gcs.address, "--num-cpus", "2"]
            args += ["--bundles", '[{"CPU": 1}]']
            result = await asyncio.to_thread(CliRunner().invoke, main, args)
            assert result.exit_code == 0, result.output
            (call,) = gcs.calls_to("RequestClusterResourceConstraint")
        (group,) = call.request.cluster_resource_constraint.resource_requests
        assert group.count == 3

    async def test_status_json_prints_the_reply(self) -> None:
        """`gcs status --format json` prints what GetClusterStatus returned."""
        reply = autoscaler_pb2.GetClusterStatusReply()
        reply.cluster_resource_state.cluster_session_name = "session_x"
        async with RecordingGcs() as gcs:
            gcs.set_status_reply(reply)
            args = ["status", "--address", gcs.address, "--format", "json"]
            result = await asyncio.to_thread(CliRunner().invoke, main, args)
        assert result.exit_code == 0, result.output
        assert "session_x" in result.output
