"""CLI output: valid JSON with hex ids, selectors in the plan table, `--format` everywhere."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner
from google.protobuf import json_format

from gcs.cli.json_output import message_to_dict
from gcs.cli.main import main
from gcs.proto import autoscaler_pb2
from gcs.testing.recording_gcs import RecordingGcs


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


NODE_ID = bytes.fromhex("ab" * 28)


class TestStatusJson:
    async def test_node_ids_print_as_hex(self) -> None:
        """Ray prints ids as hex; MessageToJson would give base64 ("q6urq6...")."""
        reply = autoscaler_pb2.GetClusterStatusReply()
        node = reply.cluster_resource_state.node_states.add(node_id=NODE_ID, instance_id="i-1")
        node.total_resources["CPU"] = 4
        async with RecordingGcs() as gcs:
            gcs.set_status_reply(reply)
            args = ["status", "--address", gcs.address, "--format", "json"]
            result = await asyncio.to_thread(CliRunner().invoke, main, args)
        assert result.exit_code == 0, result.output
        doc = _strict(result.stdout)
        (state,) = doc["cluster_resource_state"]["node_states"]
        assert state["node_id"] == "ab" * 28
        assert state["total_resources"] == {"CPU": 4.0}

    def test_nested_and_map_bytes_are_hex(self) -> None:
        """Repeated messages, nested messages and plain fields all convert."""
        state = autoscaler_pb2.ClusterResourceState()
        state.node_states.add(node_id=b"\x01\x02")
        state.pending_gang_resource_requests.add().requests.add().resources_bundle["GPU"] = 1
        doc = message_to_dict(state)
        assert doc["node_states"][0]["node_id"] == "0102"
        base64 = json.loads(json_format.MessageToJson(state))["nodeStates"][0]["nodeId"]
        assert base64 == "AQI="  # what the old output printed


CLUSTER_YAML = """
head_node_type: head
available_node_types:
  head: {resources: {CPU: 0}, max_workers: 0}
  cpu4: {resources: {CPU: 4}, max_workers: 5}
"""


class TestPlanTable:
    def test_infeasible_rows_show_their_label_selectors(self, tmp_path: Path) -> None:
        """Three requests that differ only by selector are three distinguishable rows."""
        state = autoscaler_pb2.ClusterResourceState()
        for zone in ("a", "b", "c"):
            rc = state.pending_resource_requests.add(count=1)
            rc.request.resources_bundle["TPU"] = 1
            constraint = rc.request.label_selectors.add().label_constraints.add()
            constraint.label_key = "zone"
            constraint.label_values.append(zone)
            constraint.operator = 1  # LABEL_OPERATOR_IN
        sp, cp = tmp_path / "state.json", tmp_path / "cluster.yaml"
        sp.write_text(json_format.MessageToJson(state))
        cp.write_text(CLUSTER_YAML)
        args = ["autoscaler", "plan", "--state", str(sp), "--config", str(cp)]
        result = CliRunner().invoke(main, [*args, "--format", "text"])
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        waiting = next(i for i, line in enumerate(lines) if line.startswith("WAITING"))
        for section in (lines[:waiting], lines[waiting:]):  # Ray's list, then the verdicts
            rows = [line for line in section if ' x {"TPU"' in line]
            assert len(rows) == 3 and len(set(rows)) == 3, rows
            assert any("zone in (a)" in r for r in rows)


class TestRequestResources:
    async def test_zero_cpus_says_cleared(self) -> None:
        """--num-cpus 0 clears the constraint and says so (it used to say "set")."""
        async with RecordingGcs() as gcs:
            args = ["request-resources", "--address", gcs.address, "--num-cpus", "0"]
            result = await asyncio.to_thread(CliRunner().invoke, main, args)
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == "request_resources constraint cleared"


class TestStatusVerbose:
    async def test_lists_every_node_and_the_virtual_clusters(self) -> None:
        """`gcs status -v`: one entry per node (hex id, type, usage, labels), then VCs."""
        from gcs.raylet.agent import RayletAgent, RayletConfig
        from gcs.server import GcsServer
        from gcs.store.memory import MemoryStore
        from tests.conftest import fast_config

        server = GcsServer(fast_config(), store=MemoryStore())
        await server.start()
        agent = RayletAgent(
            RayletConfig(
                gcs_address=server.address,
                resources={"CPU": 4.0},
                node_type="cpu4",
                labels={"zone": "a"},
            )
        )
        try:
            await agent.start()
            args = ["status", "-v", "--address", server.address]
            result = await asyncio.to_thread(CliRunner().invoke, main, args)
            as_json = await asyncio.to_thread(CliRunner().invoke, main, [*args, "--format", "json"])
        finally:
            await agent.stop()
            await server.stop()
        assert result.exit_code == 0, result.output
        assert f"Node {agent.node_id.hex()} (cpu4, 127.0.0.1)" in result.stdout
        assert "0.0/4.0 CPU" in result.stdout and "labels: zone=a" in result.stdout
        assert "kPrimaryClusterID (divisible): 1 nodes [cpu4: 1]" in result.stdout
        doc = _strict(as_json.stdout)
        assert doc["virtual_clusters"][0]["virtual_cluster_id"] == "kPrimaryClusterID"


class TestOneAddressFlag:
    def test_old_spellings_are_hidden_aliases(self, tmp_path: Path) -> None:
        """`--address` everywhere; `--gcs-address` / `--from-gcs` still parse, unlisted."""
        runner = CliRunner()
        for command in (["raylet"], ["raylet-fleet"], ["submit"], ["autoscaler", "plan"]):
            text = runner.invoke(main, [*command, "-h"]).stdout
            assert "--address" in text
            assert "--gcs-address" not in text and "--from-gcs" not in text
        cfg = tmp_path / "c.yaml"
        cfg.write_text(CLUSTER_YAML)
        old = runner.invoke(
            main, ["autoscaler", "plan", "--from-gcs", "127.0.0.1:1", "--config", str(cfg)]
        )
        assert old.exit_code == 1 and "127.0.0.1:1" in old.output
        both = runner.invoke(
            main, ["submit", "--address", "127.0.0.1:1", "--gcs-address", "127.0.0.1:2"]
        )
        assert both.exit_code == 2 and "twice" in both.output
