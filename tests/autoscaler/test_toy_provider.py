"""Adding a provider is one file and one registry row: the toy (``toy_provider``: the file,
``TOY_ROW``: the row) is taken by its type name ``toy`` by a cluster YAML, by
``gcs autoscaler plan`` and by the provider contract suite, with no other change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf import json_format

from gcs.autoscaler.config import ConfigError, load_cluster_config
from gcs.autoscaler.providers.registry import PROVIDERS, ProviderRow
from gcs.cli.main import main
from gcs.proto import autoscaler_pb2
from tests.autoscaler import test_provider_contract
from tests.autoscaler.toy_provider import TOY_PROVIDERS, TOY_ROW

CLUSTER_YAML = """\
max_workers: 4
provider: {type: toy}
head_node_type: head
available_node_types:
  head: {resources: {CPU: 0}, max_workers: 0}
  cpu: {resources: {CPU: 4}, max_workers: 4}
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    """A toy cluster YAML and a cluster state asking for 3 x CPU 4 (no node runs them)."""
    state = autoscaler_pb2.ClusterResourceState(cluster_resource_state_version=1)
    state.node_states.add(
        node_id=b"\xaa" * 28, instance_id="head-1", ray_node_type_name="head",
        status=autoscaler_pb2.IDLE,
    )  # fmt: skip
    state.pending_resource_requests.add(count=3).request.resources_bundle["CPU"] = 4
    config, state_path = tmp_path / "cluster.yaml", tmp_path / "state.json"
    config.write_text(CLUSTER_YAML)
    state_path.write_text(json_format.MessageToJson(state))
    return str(config), str(state_path)


class TestToyProvider:
    def test_a_cluster_yaml_names_it_by_its_type(self, files: tuple[str, str]) -> None:
        cluster = load_cluster_config(files[0], providers=TOY_PROVIDERS)
        assert cluster.provider.type == "toy"

    def test_without_its_row_the_type_is_unknown(self, files: tuple[str, str]) -> None:
        with pytest.raises(ConfigError, match=r"provider\.type: 'toy' is not supported here"):
            load_cluster_config(files[0])

    def test_gcs_autoscaler_plan_takes_it(self, files: tuple[str, str]) -> None:
        """The command line reads the registry its context carries (``obj``)."""
        config, state = files
        args = ["autoscaler", "plan", "--config", config, "--state", state, "--format", "json"]
        result = CliRunner().invoke(main, args, obj=TOY_PROVIDERS)
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["launch"] == {"cpu": 3}
        refused = CliRunner().invoke(main, args)  # this build's registry has no toy
        assert refused.exit_code == 2 and "'toy' is not supported here" in refused.output

    def test_the_contract_suite_runs_on_it(self) -> None:
        assert TOY_ROW.type in test_provider_contract.REGISTERED

    def test_its_row_is_one_line_of_the_registry(self) -> None:
        assert TOY_PROVIDERS == {**PROVIDERS, "toy": TOY_ROW}
        with pytest.raises(ValueError, match="registered twice"):
            TOY_PROVIDERS.with_rows(ProviderRow("toy", "elsewhere:build"))
