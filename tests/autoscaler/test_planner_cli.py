"""``gcs autoscaler plan``: files or a live GCS in, decisions with reasons out."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from google.protobuf import json_format

from gcs.autoscaler.planner import fetch_state
from gcs.cli.autoscaler import autoscaler
from gcs.proto import autoscaler_pb2, gcs_service_pb2
from gcs.rpc import service_handler
from gcs.rpc.descriptors import AUTOSCALER_STATE, NODE_INFO

CLUSTER_YAML = """
max_workers: 10
idle_timeout_minutes: 5
upscaling_speed: 1.0
head_node_type: head
available_node_types:
  head: {resources: {CPU: 0}, min_workers: 0, max_workers: 0}
  cpu4: {resources: {CPU: 4}, min_workers: 1, max_workers: 5}
  gpu8: {resources: {CPU: 8, GPU: 8}, min_workers: 0, max_workers: 3}
"""


def _state() -> autoscaler_pb2.ClusterResourceState:
    s = autoscaler_pb2.ClusterResourceState(cluster_resource_state_version=3)
    s.node_states.add(
        node_id=bytes.fromhex("aa" * 28), instance_id="head-1", ray_node_type_name="head",
        status=autoscaler_pb2.IDLE, idle_duration_ms=10_000_000,
    )  # fmt: skip
    for i, idle in enumerate((320_000, 310_000)):
        n = s.node_states.add(
            node_id=bytes([i + 1]) * 28, instance_id=f"w{i}", ray_node_type_name="cpu4",
            status=autoscaler_pb2.IDLE, idle_duration_ms=idle,
        )  # fmt: skip
        n.total_resources["CPU"] = 4
        n.available_resources["CPU"] = 4
    rc = s.pending_resource_requests.add(count=12)
    rc.request.resources_bundle["GPU"] = 1
    return s


def _write(tmp: Path, state: autoscaler_pb2.ClusterResourceState) -> tuple[str, str]:
    sp, cp = tmp / "state.json", tmp / "cluster.yaml"
    sp.write_text(json_format.MessageToJson(state))
    cp.write_text(CLUSTER_YAML)
    return str(sp), str(cp)


class TestPlanFromFiles:
    """Planning from a state JSON file and a cluster YAML."""

    def test_prints_launches_terminations_and_reasons_as_json(self, tmp_path: Path) -> None:
        """12 GPU requests -> 2 gpu8; idle w0 (320 s > 300 s) goes; w1 is kept for min_workers."""
        sp, cp = _write(tmp_path, _state())
        res = CliRunner().invoke(
            autoscaler, ["plan", "--state", sp, "--config", cp, "--format", "json"]
        )
        assert res.exit_code == 0, res.output
        doc = json.loads(res.output)
        assert doc["launch"] == {"gpu8": 2}
        assert [(t["instance_id"], t["cause"]) for t in doc["terminate"]] == [("w0", "IDLE")]
        assert doc["terminate"][0]["node_id"] == "01" * 28
        assert "idle for 320 s > timeout 300 s" in doc["terminate"][0]["reason"]
        assert any(r.startswith("launch 2 x gpu8: 12 pending {GPU:1}") for r in doc["reasons"])
        assert any("keep node w1" in r and "min_workers of cpu4" in r for r in doc["reasons"])
        assert doc["infeasible"] == {"requests": [], "gangs": [], "constraints": []}

    def test_table_format_is_for_people(self, tmp_path: Path) -> None:
        """--format table lists sections with one row per decision."""
        sp, cp = _write(tmp_path, _state())
        res = CliRunner().invoke(
            autoscaler, ["plan", "--state", sp, "--config", cp, "--format", "table"]
        )
        assert res.exit_code == 0, res.output
        assert "LAUNCH" in res.output and "gpu8" in res.output and "IDLE" in res.output

    def test_infeasible_requests_are_reported(self, tmp_path: Path) -> None:
        """A shape no node type has is infeasible, with a count."""
        s = _state()
        rc = s.pending_resource_requests.add(count=3)
        rc.request.resources_bundle["TPU"] = 1
        sp, cp = _write(tmp_path, s)
        doc = json.loads(
            CliRunner()
            .invoke(autoscaler, ["plan", "--state", sp, "--config", cp, "--format", "json"])
            .output
        )
        assert doc["infeasible"]["requests"] == [{"resources": {"TPU": 1.0}, "count": 3}]


class TestPlanBadInput:
    """Bad input fails with a message naming the place."""

    @pytest.mark.parametrize(
        ("yaml_text", "needle"),
        [
            (
                "available_node_types: {a: {resources: {CPU: -1}}}",
                "available_node_types.a.resources.CPU",
            ),
            (
                "available_node_types: {a: {min_workers: 3, max_workers: 1}}",
                "min_workers 3 > max_workers 1",
            ),
            ("available_node_types: [1, 2", "malformed YAML"),
            ("head_node_type: x\navailable_node_types: {a: {}, b: {}}", "head_node_type"),
        ],
    )
    def test_bad_cluster_yaml_names_the_place(
        self, tmp_path: Path, yaml_text: str, needle: str
    ) -> None:
        """Negative resources, min > max, malformed YAML, unknown head type."""
        sp, cp = _write(tmp_path, _state())
        Path(cp).write_text(yaml_text)
        res = CliRunner().invoke(
            autoscaler, ["plan", "--state", sp, "--config", cp, "--format", "json"]
        )
        assert res.exit_code != 0
        assert needle in res.output

    def test_unknown_node_type_in_state_is_left_out_with_a_warning(self, tmp_path: Path) -> None:
        """A live node whose type the config lacks does not abort the plan: it is left out,
        and a warning names node_states[i] and the type (in the JSON and on stderr)."""
        s = _state()
        s.node_states[1].ray_node_type_name = "mystery"
        sp, cp = _write(tmp_path, s)
        res = CliRunner().invoke(
            autoscaler, ["plan", "--state", sp, "--config", cp, "--format", "json"]
        )
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        (warning,) = doc["warnings"]
        assert "node_states[1]" in warning and "mystery" in warning
        assert doc["launch"] == {"gpu8": 2}
        assert "Warning: node_states[1]" in res.stderr

    def test_a_warning_is_printed_once_in_text(self, tmp_path: Path) -> None:
        """As text, each warning appears once (on stderr), not again in the table."""
        s = _state()
        s.node_states[1].ray_node_type_name = "mystery"
        sp, cp = _write(tmp_path, s)
        res = CliRunner().invoke(autoscaler, ["plan", "--state", sp, "--config", cp])
        assert res.exit_code == 0, res.output
        assert (res.stdout + res.stderr).count("node_states[1]") == 1
        assert "Warning: node_states[1]" in res.stderr

    def test_malformed_state_json_is_an_error(self, tmp_path: Path) -> None:
        """Not JSON at all -> clear error with the file name."""
        sp, cp = _write(tmp_path, _state())
        Path(sp).write_text("{not json")
        res = CliRunner().invoke(
            autoscaler, ["plan", "--state", sp, "--config", cp, "--format", "json"]
        )
        assert res.exit_code != 0 and "state.json" in res.output

    def test_negative_resources_in_state_are_rejected(self, tmp_path: Path) -> None:
        """A negative request amount names its place."""
        s = _state()
        s.pending_resource_requests[0].request.resources_bundle["GPU"] = -1
        sp, cp = _write(tmp_path, s)
        res = CliRunner().invoke(
            autoscaler, ["plan", "--state", sp, "--config", cp, "--format", "json"]
        )
        assert res.exit_code != 0 and "pending_resource_requests[0]" in res.output


class _FakeGcs:
    def __init__(self, state: autoscaler_pb2.ClusterResourceState, cluster_id: bytes) -> None:
        self.state = state
        self.cluster_id = cluster_id
        self.seen_metadata: list[tuple[str, str]] = []

    async def GetClusterId(self, request, context):
        return gcs_service_pb2.GetClusterIdReply(cluster_id=self.cluster_id)

    async def GetClusterResourceState(self, request, context):
        self.seen_metadata = list(context.invocation_metadata())
        return autoscaler_pb2.GetClusterResourceStateReply(cluster_resource_state=self.state)


class TestPlanFromGcs:
    """--from-gcs reads a live GCS the way Ray's autoscaler does."""

    async def test_fetches_state_with_cluster_id_metadata(self) -> None:
        """GetClusterId, then GetClusterResourceState carrying ray_cluster_id."""
        fake = _FakeGcs(_state(), b"\x07" * 28)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (service_handler(NODE_INFO, fake), service_handler(AUTOSCALER_STATE, fake))
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            state = await fetch_state(f"127.0.0.1:{port}")
        finally:
            await server.stop(None)
        assert state == _state()
        assert ("ray_cluster_id", "07" * 28) in fake.seen_metadata
