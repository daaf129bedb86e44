"""``gcs autoscaler plan`` with IPPR specs in the cluster YAML and rescheduling groups."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from google.protobuf import json_format

from gcs.cli.autoscaler import autoscaler
from gcs.proto import autoscaler_pb2

GI = 2**30
CLUSTER_YAML = """
head_node_type: head
available_node_types:
  head: {resources: {CPU: 0}}
  small: {resources: {CPU: 1, memory: 4294967296}, max_workers: 1,
          ippr: {max-cpu: "4", max-memory: 12Gi, resize-timeout: 60}}
"""


def _state(cpu: float = 3) -> autoscaler_pb2.ClusterResourceState:
    s = autoscaler_pb2.ClusterResourceState()
    s.node_states.add(node_id=b"\xaa" * 28, instance_id="head", ray_node_type_name="head")
    n = s.node_states.add(
        node_id=b"\x01" * 28, instance_id="pod-1", ray_node_type_name="small",
        status=autoscaler_pb2.IDLE,
    )  # fmt: skip
    for k, v in {"CPU": 1.0, "memory": 4.0 * GI}.items():
        n.total_resources[k] = v
        n.available_resources[k] = v
    s.pending_resource_requests.add(count=1).request.resources_bundle["CPU"] = cpu
    return s


def _plan(tmp: Path, state, yaml_text: str = CLUSTER_YAML, *extra: str):  # type: ignore[no-untyped-def]
    sp, cp = tmp / "state.json", tmp / "cluster.yaml"
    sp.write_text(json_format.MessageToJson(state))
    cp.write_text(yaml_text)
    return CliRunner().invoke(
        autoscaler, ["plan", "--state", str(sp), "--config", str(cp), "--format", "json", *extra]
    )


class TestPlanResizes:
    """IPPR specs come from the YAML; pod status from a file or is assumed at rest."""

    def test_resize_is_listed_in_json_with_reason(self, tmp_path: Path) -> None:
        """CPU:3 on a 1-CPU pod of an IPPR type (max 4 / 12Gi): one resize, no launch."""
        res = _plan(tmp_path, _state())
        assert res.exit_code == 0, res.output
        doc = json.loads(res.output)
        assert doc["launch"] == {}
        [r] = doc["resize"]
        assert (r["instance_id"], r["cpu"], r["memory"]) == ("pod-1", 4.0, 12 * GI)
        assert r["node_id"] == "01" * 28 and "IPPR max" in r["reason"]

    def test_table_has_a_resize_section(self, tmp_path: Path) -> None:
        """--format table prints RESIZE rows."""
        res = _plan(tmp_path, _state(), CLUSTER_YAML, "--format", "table")
        assert res.exit_code == 0, res.output
        assert "RESIZE\n  pod-1" in res.output and "CPU 1 -> 4" in res.output

    def test_ippr_status_file_blocks_a_failed_pod(self, tmp_path: Path) -> None:
        """A pod whose last resize failed is not grown; the max-workers cap leaves it infeasible."""
        status = tmp_path / "ippr.json"
        status.write_text(
            json.dumps({"pod-1": {"current-cpu": 1, "current-memory": 4 * GI, "last-failed-at": 9}})
        )
        res = _plan(tmp_path, _state(), CLUSTER_YAML, "--ippr-status", str(status))
        assert res.exit_code == 0, res.output
        doc = json.loads(res.output)
        assert doc["resize"] == [] and doc["infeasible"]["requests"][0]["count"] == 1

    def test_ippr_entry_missing_a_key_names_the_place(self, tmp_path: Path) -> None:
        """All three keys of the annotation schema are required."""
        bad = CLUSTER_YAML.replace(", resize-timeout: 60", "")
        res = _plan(tmp_path, _state(), bad)
        assert res.exit_code != 0 and "small.ippr.resize-timeout: required" in res.output


class TestPlanReschedulingGroup:
    """Gang details give the strategy and state; the CLI flag enables lost-bundle replacement."""

    def test_lost_strict_pack_bundles_must_join_survivors(self, tmp_path: Path) -> None:
        """Survivor pod-1 (labelled _PG_ab) has no room: infeasible with the flag, not without."""
        s = _state(cpu=0.5)
        s.node_states[1].dynamic_labels["_PG_ab"] = ""
        s.node_states[1].available_resources["CPU"] = 0.5
        g = s.pending_gang_resource_requests.add(details="ab:STRICT_PACK|RESCHEDULING")
        req = g.bundle_selectors.add().resource_requests.add()
        req.resources_bundle["CPU"] = 1
        req.placement_constraints.add().affinity.label_name = "_PG_ab"
        no_ippr = CLUSTER_YAML.split(",\n          ippr", maxsplit=1)[0].replace(
            "max_workers: 1", "max_workers: 2"
        )
        no_ippr += "}\n"
        off = json.loads(_plan(tmp_path, s, no_ippr).output)
        assert off["infeasible"]["gangs"] == [] and off["launch"] == {"small": 1}  # Ray's way
        on = json.loads(_plan(tmp_path, s, no_ippr, "--lost-bundle-replacement").output)
        assert [g["details"] for g in on["infeasible"]["gangs"]] == ["ab:STRICT_PACK|RESCHEDULING"]
        assert any("must join its surviving bundles on pod-1" in r for r in on["reasons"])
        # With IPPR the survivor pod can grow in place to take the lost bundle.
        grown = json.loads(_plan(tmp_path, s, CLUSTER_YAML, "--lost-bundle-replacement").output)
        assert grown["infeasible"]["gangs"] == [] and len(grown["resize"]) == 1
