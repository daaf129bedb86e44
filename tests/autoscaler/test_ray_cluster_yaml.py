"""Ray's cluster-launcher YAML read as Ray 2.60 reads it (issue 31): every key of Ray's
schema accepted, the unknown ones all named, the ones nothing acts on named in one warning,
each node type's resources filled in from its provider's description of the instance type
(Ray's rules: memory only for workers, less the object store's share; the YAML's keys win),
Ray's AWS defaults under the YAML, and ``gcs autoscaler plan`` on Ray's own AWS examples
giving the node counts of the same clusters spelled out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from google.protobuf import json_format

from gcs.autoscaler.config import (
    ClusterConfig,
    ConfigError,
    load_cluster_config,
    parse_cluster_config,
    resolve_cluster_config,
)
from gcs.autoscaler.providers.registry import PROVIDERS, ProviderRow, Registry
from gcs.cli.main import main
from gcs.proto import autoscaler_pb2
from tests.autoscaler import toy_catalog
from tests.autoscaler.toy_catalog import DATA, TOY_AWS_PROVIDERS

EXAMPLES = ("example-minimal", "example-full", "example-gpu-docker")
M5_WORKER_MEMORY = int(8192 * 2**20 * 0.7)


async def unreachable_cloud(provider: Any, node_configs: Any) -> Any:
    """A ``node_type_resources`` whose cloud cannot be reached."""
    raise RuntimeError("Unable to locate credentials")


def resolve(raw: Any, providers: Registry = TOY_AWS_PROVIDERS) -> ClusterConfig:
    return asyncio.run(resolve_cluster_config(raw, providers=providers))


def example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DATA / f"{name}.yaml").read_text())
    return loaded


def resources(cluster: ClusterConfig) -> dict[str, dict[str, float]]:
    return {n: dict(t.resources) for n, t in cluster.scheduler.node_types.items()}


class TestRaysAwsExamplesLoad:
    @pytest.mark.parametrize("name", EXAMPLES)
    def test_each_loads_with_its_resources_from_the_instance_type(self, name: str) -> None:
        cluster = resolve(example(name))
        assert cluster.provider.type == "aws"
        worker = cluster.scheduler.node_types["ray.worker.default"]
        assert dict(worker.resources) == {"CPU": 2, "memory": M5_WORKER_MEMORY}
        head = cluster.scheduler.node_types[cluster.head_node_type]
        assert "memory" not in head.resources  # Ray detects memory for workers only
        assert cluster.scheduler.max_num_nodes == 3  # max_workers 2 (+ the head)
        assert cluster.scheduler.idle_timeout_s == 300
        assert cluster.upscaling_speed == 1.0

    def test_the_gpu_head_gets_its_gpu_and_accelerator_type(self) -> None:
        cluster = resolve(example("example-gpu-docker"))
        assert cluster.head_node_type == "ray.head.gpu"
        assert resources(cluster)["ray.head.gpu"] == {
            "CPU": 4,
            "GPU": 1,
            "accelerator_type:K80": 1,
        }

    def test_rays_aws_defaults_fill_what_the_minimal_example_leaves_out(self) -> None:
        """No head_node_type, max_workers, idle timeout or speed in the file: Ray's AWS
        defaults.yaml gives them; the worker type's own max (4) stays under the cluster's 2."""
        raw = example("example-minimal")
        assert not {"head_node_type", "max_workers", "idle_timeout_minutes"} & raw.keys()
        cluster = resolve(raw)
        assert cluster.head_node_type == "ray.head.default"
        assert cluster.scheduler.node_types["ray.worker.default"].max_workers == 4
        assert cluster.scheduler.max_num_nodes == 3

    def test_the_hook_gets_the_provider_section_and_each_node_config(self) -> None:
        toy_catalog.CALLS.clear()
        resolve(example("example-gpu-docker"))
        (provider, node_configs), *more = toy_catalog.CALLS
        assert more == []
        assert provider["region"] == "us-west-2"
        assert node_configs["ray.head.gpu"]["InstanceType"] == "p2.xlarge"
        assert node_configs["ray.worker.default"]["InstanceMarketOptions"] == {"MarketType": "spot"}

    def test_launcher_keys_are_recorded_with_rays_per_type_rules(self) -> None:
        cluster = resolve(example("example-gpu-docker"))
        launcher = cluster.launcher
        assert launcher.head_setup() == ("pip install boto3==1.4.8",)
        assert launcher.worker_setup("ray.worker.default") == ()
        assert launcher.worker_start_ray_commands[0] == "ray stop"
        assert launcher.docker_for("ray.worker.default") == {
            "image": "rayproject/ray-ml:latest-gpu",
            "container_name": "ray_nvidia_docker",
            "worker_image": "rayproject/ray-ml:latest-cpu",
        }
        assert launcher.node_types["ray.head.gpu"].node_config["InstanceType"] == "p2.xlarge"

    def test_a_node_types_docker_counts_only_under_a_cluster_docker(self) -> None:
        """Ray's AWS defaults carry ``docker: {}``, so the minimal example's types may add
        their own; without any cluster ``docker`` key Ray leaves a type's unused."""
        raw = example("example-minimal")
        raw["available_node_types"]["ray.worker.default"]["docker"] = {"worker_image": "w"}
        assert resolve(raw).launcher.docker_for("ray.worker.default") == {"worker_image": "w"}
        bare = {
            "available_node_types": {
                "h": {"resources": {"CPU": 1}, "docker": {"worker_image": "w"}}
            }
        }
        assert resolve(bare, PROVIDERS).launcher.docker_for("h") == {}

    def test_a_node_types_own_setup_commands_replace_the_clusters(self) -> None:
        raw = example("example-full")
        raw["setup_commands"] = ["echo common"]
        raw["worker_setup_commands"] = ["echo worker"]
        raw["available_node_types"]["ray.worker.default"]["worker_setup_commands"] = ["own"]
        raw["available_node_types"]["ray.worker.default"]["initialization_commands"] = ["i"]
        launcher = resolve(raw).launcher
        assert launcher.worker_setup("ray.head.default") == ("echo common", "echo worker")
        assert launcher.worker_setup("ray.worker.default") == ("own",)
        assert launcher.initialization("ray.worker.default") == ("i",)
        assert launcher.initialization("ray.head.default") == ()


class TestResourceMerge:
    def test_the_yamls_resource_keys_win_over_the_detected_ones(self) -> None:
        raw = example("example-full")
        raw["available_node_types"]["ray.worker.default"]["resources"] = {"CPU": 1, "custom": 5}
        raw["available_node_types"]["ray.head.default"]["resources"] = {"CPU": 0}
        got = resources(resolve(raw))
        assert got["ray.worker.default"] == {"CPU": 1, "custom": 5, "memory": M5_WORKER_MEMORY}
        assert got["ray.head.default"] == {"CPU": 0}

    def test_an_instance_type_the_cloud_does_not_offer_is_named(self) -> None:
        raw = example("example-full")
        raw["available_node_types"]["ray.worker.default"]["node_config"]["InstanceType"] = "x9"
        with pytest.raises(ConfigError) as err:
            resolve(raw)
        assert str(err.value) == (
            "available_node_types.ray.worker.default.node_config.InstanceType: 'x9' is not "
            "offered in us-west-2"
        )

    def test_a_failing_cloud_is_one_line(self) -> None:
        row = ProviderRow("broken", "x:y", node_type_resources=f"{__name__}:unreachable_cloud")
        raw = {
            "provider": {"type": "broken"},
            "head_node_type": "h",
            "available_node_types": {"h": {"resources": {}, "node_config": {}}},
        }
        with pytest.raises(ConfigError, match=r"^provider\.type broken: cannot read the node "
                           r"types' resources \(Unable to locate credentials\)$"):  # fmt: skip
            resolve(raw, PROVIDERS.with_rows(row))

    def test_the_plain_parse_does_not_ask_the_cloud_and_says_so(self) -> None:
        with pytest.raises(
            ConfigError, match=r"ray\.worker\.default\.resources: empty; provider.type aws finds"
        ):
            parse_cluster_config(example("example-full"), providers=TOY_AWS_PROVIDERS)


class TestEmptyResourcesWithoutAHook:
    RAW = {
        "provider": {"type": "local"},
        "max_workers": 2,
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {}, "max_workers": 0},
            "cpu": {"resources": {}, "max_workers": 2, "node_config": {"InstanceType": "x"}},
        },
    }

    def test_a_launchable_type_without_resources_is_named(self) -> None:
        with pytest.raises(ConfigError) as err:
            resolve(self.RAW, PROVIDERS)
        assert str(err.value).startswith(
            "available_node_types.cpu.resources: empty; provider.type local cannot find"
        )

    def test_plan_says_it_in_one_line_instead_of_no_node_type_has_cpu(self, tmp_path: Path) -> None:
        config = tmp_path / "cluster.yaml"
        config.write_text(yaml.safe_dump(self.RAW))
        state = _state_file(tmp_path, "head", {"CPU": 2})
        args = ["autoscaler", "plan", "--config", str(config), "--state", state]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2
        assert "available_node_types.cpu.resources: empty" in result.output
        assert "no node type has CPU" not in result.output

    def test_a_head_that_is_never_launched_may_leave_them_to_its_raylet(self) -> None:
        raw = {**self.RAW, "available_node_types": {"head": {"resources": {}}}}
        assert resources(resolve(raw, PROVIDERS)) == {"head": {}}


class TestKeys:
    def test_every_unknown_key_is_named(self) -> None:
        raw = {
            **example("example-full"),
            "initial_workers": 0,
            "autoscaling_mode": "default",
            "target_utilization_fraction": 0.8,
        }
        with pytest.raises(ConfigError) as err:
            resolve(raw)
        assert str(err.value) == (
            "autoscaling_mode, initial_workers, target_utilization_fraction: unknown keys"
        )

    def test_every_unknown_provider_key_is_named(self) -> None:
        raw = example("example-full")
        raw["provider"].update(zone="a", flavour="b")
        with pytest.raises(ConfigError, match=r"^provider\.flavour, provider\.zone: unknown keys$"):
            resolve(raw)

    def test_rays_provider_keys_are_accepted_for_any_provider(self) -> None:
        raw = {
            "provider": {"type": "local", "region": "r", "availability_zone": "a,b"},
            "available_node_types": {"h": {"resources": {"CPU": 1}}},
        }
        cluster = resolve(raw, PROVIDERS)
        assert cluster.warnings == (
            "keys of Ray's cluster launcher not acted on here (provider.type local): "
            "provider.region, provider.availability_zone",
        )

    def test_the_keys_nothing_acts_on_are_named_once_all_together(self) -> None:
        cluster = resolve(example("example-gpu-docker"))
        (warning,) = cluster.warnings
        named = warning.split(": ", 1)[1].split(", ")
        assert named == [
            "docker", "auth", "file_mounts", "setup_commands", "head_setup_commands",
            "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands",
            "available_node_types.ray.worker.default.docker",
        ]  # fmt: skip

    def test_a_provider_that_acts_on_launcher_keys_is_not_warned_about_them(self) -> None:
        row = ProviderRow(
            "runner", "x:y", launcher_keys=frozenset({"setup_commands", "docker",
                                                      "available_node_types.*.docker"}),
        )  # fmt: skip
        raw = {
            "provider": {"type": "runner"},
            "setup_commands": ["true"],
            "docker": {"image": "i"},
            "auth": {"ssh_user": "u"},
            "available_node_types": {"h": {"resources": {"CPU": 1}, "docker": {}}},
        }
        cluster = resolve(raw, PROVIDERS.with_rows(row))
        assert cluster.warnings == (
            "keys of Ray's cluster launcher not acted on here (provider.type runner): auth",
        )

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            ({"docker": {"run_options": "--x"}}, "docker.run_options: expected a list of strings"),
            ({"docker": {"pull_before_run": "yes"}}, "docker.pull_before_run: expected true or"),
            ({"docker": {"imag": "x"}}, "docker.imag: unknown key"),
            ({"auth": {"ssh_user": 1}}, "auth.ssh_user: expected a string"),
            ({"auth": {"ssh_proxy_use_node_id": True}}, "auth.ssh_proxy_command: required"),
            ({"setup_commands": ["ok", 3]}, r"setup_commands\[1\]: expected a shell command"),
            ({"head_start_ray_commands": "ray start"}, "head_start_ray_commands: expected a list"),
            ({"file_mounts": ["/a"]}, "file_mounts: expected a mapping"),
            ({"file_mounts_sync_continuously": "no"}, "file_mounts_sync_continuously: expected"),
            ({"rsync_exclude": [1]}, "rsync_exclude: expected a list of strings"),
            ({"metadata": 3}, "metadata: expected a mapping"),
            ({"head_node": {"InstanceType": "m5.large"}}, "head_node: the legacy form"),
            ({"max_workers": -1}, "max_workers: expected a non-negative integer"),
            ({"upscaling_speed": "fast"}, "upscaling_speed: expected a number"),
            ({"idle_timeout_minutes": -1}, "idle_timeout_minutes: must be >= 0"),
            ({"max_workers": 0}, r"max_workers: 0 is less than the node types' min_workers \(1\)"),
            ({"cluster_name": ""}, "cluster_name: expected a non-empty string"),
        ],
    )
    def test_each_bad_value_names_its_field(self, change: dict[str, Any], message: str) -> None:
        with pytest.raises(ConfigError, match=f"^{message}"):
            resolve({**example("example-gpu-docker"), **change})

    @pytest.mark.parametrize(
        ("key", "value", "message"),
        [
            ("docker", {"image": "x"}, r"\.docker\.image: unknown key"),
            ("worker_setup_commands", "x", r"\.worker_setup_commands: expected a list"),
            ("initialization_commands", [None], r"\.initialization_commands\[0\]: expected"),
            ("node_config", [], r"\.node_config: expected a mapping"),
            ("max_workers", 1.5, r"\.max_workers: expected a non-negative integer"),
            ("resources", {"CPU": "two"}, r"\.resources\.CPU: expected a number"),
        ],
    )
    def test_each_bad_node_type_value_names_its_field(
        self, key: str, value: Any, message: str
    ) -> None:
        raw = example("example-gpu-docker")
        raw["available_node_types"]["ray.worker.default"][key] = value
        with pytest.raises(ConfigError, match=f"^available_node_types.ray.worker.default{message}"):
            resolve(raw)

    def test_a_worker_type_without_max_workers_takes_the_clusters(self) -> None:
        """Ray's fill_node_type_min_max_workers: the cluster's max_workers; the head 0."""
        raw = {
            "max_workers": 7,
            "head_node_type": "h",
            "available_node_types": {"h": {"resources": {}}, "w": {"resources": {"CPU": 1}}},
        }
        types = resolve(raw, PROVIDERS).scheduler.node_types
        assert (types["w"].max_workers, types["h"].max_workers) == (7, 1)  # head: 0 (+1)


def _state_file(tmp: Path, head_type: str, head_resources: dict[str, float]) -> str:
    """The head running idle; 6 x {CPU: 2} and 2 x {memory: 4 GB} waiting."""
    state = autoscaler_pb2.ClusterResourceState(cluster_resource_state_version=1)
    head = state.node_states.add(
        node_id=b"\xaa" * 28, instance_id="head-1", ray_node_type_name=head_type,
        status=autoscaler_pb2.IDLE,
    )  # fmt: skip
    for key, value in head_resources.items():
        head.total_resources[key] = value
        head.available_resources[key] = value
    state.pending_resource_requests.add(count=6).request.resources_bundle["CPU"] = 2
    state.pending_resource_requests.add(count=2).request.resources_bundle["memory"] = 4e9
    path = tmp / f"state-{head_type}.json"
    path.write_text(json_format.MessageToJson(state))
    return str(path)


class TestPlanOnRaysExamples:
    @pytest.mark.parametrize("name", EXAMPLES)
    def test_same_node_counts_as_the_cluster_spelled_out(self, name: str, tmp_path: Path) -> None:
        spelled = load_cluster_config(
            DATA / f"{name}.spelled-out.yaml", providers=TOY_AWS_PROVIDERS
        )
        head_type = spelled.head_node_type
        state = _state_file(
            tmp_path, head_type, dict(spelled.scheduler.node_types[head_type].resources)
        )
        docs = []
        for config in (DATA / f"{name}.yaml", DATA / f"{name}.spelled-out.yaml"):
            args = ["autoscaler", "plan", "--config", str(config), "--state", state,
                    "--format", "json"]  # fmt: skip
            result = CliRunner().invoke(main, args, obj=TOY_AWS_PROVIDERS)
            assert result.exit_code == 0, result.output
            docs.append(json.loads(result.stdout))
        ray_yaml, spelled_out = docs
        # 6 x CPU 2 + 2 x 4 GB memory want more m5.large workers than max_workers 2 allows
        assert ray_yaml["launch"] == spelled_out["launch"] == {"ray.worker.default": 2}
        assert ray_yaml.get("terminate") == spelled_out.get("terminate")

    def test_plan_names_the_keys_nothing_acts_on_once(self, tmp_path: Path) -> None:
        state = _state_file(tmp_path, "ray.head.default", {"CPU": 2})
        config = DATA / "example-full.yaml"
        args = ["autoscaler", "plan", "--config", str(config), "--state", state]
        result = CliRunner().invoke(main, args, obj=TOY_AWS_PROVIDERS)
        assert result.exit_code == 0, result.output
        assert result.stderr.count("Warning: ") == 1
        assert "not acted on here (provider.type aws): docker, auth, file_mounts" in result.stderr
