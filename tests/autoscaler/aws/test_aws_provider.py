"""The AWS provider on moto's EC2 server (``cloud.Ec2World``): what it launches (type,
tags, user data), that a replayed or restarted launch never launches twice, subnets and
zones in order, each injected API fault with its typed report, throttling backed off on the
injected clock, spot interruptions, stopped-instance reuse and paginated listing; and the
registry's resources hook on Ray 2.60's example YAMLs."""

from __future__ import annotations

import asyncio
import json
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gcs.autoscaler.config import ConfigError, parse_cluster_config
from gcs.autoscaler.providers.aws.defaults import defaults
from gcs.autoscaler.providers.base import LaunchErrorKind, LaunchNodeError, TerminateNodeError
from gcs.autoscaler.providers.registry import PROVIDERS
from tests.autoscaler.aws.cloud import IMAGE, REGION, Ec2World, shared_world
from tests.autoscaler.clock import SteppedClock

EXAMPLES = Path(__file__).parent.parent / "data" / "ray_aws"  # Ray 2.60's, verbatim
CLUSTER = "aws-test"


def cluster_yaml(**provider: Any) -> dict[str, Any]:
    node = {"InstanceType": "m5.large", "ImageId": IMAGE}
    return {
        "cluster_name": CLUSTER,
        "provider": {"type": "aws", "region": REGION, **provider},
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "node_config": node},
            "cpu": {
                "resources": {"CPU": 2},
                "labels": {"team": "a"},
                "max_workers": 200,
                "node_config": node,
                "worker_setup_commands": ["echo setting up", "pip list"],
            },
            "spot": {
                "resources": {"CPU": 2},
                "max_workers": 10,
                "node_config": {**node, "InstanceMarketOptions": {"MarketType": "spot"}},
            },
        },
    }


@pytest.fixture
def world() -> Iterator[Ec2World]:
    yield shared_world()


def provider_on(world: Ec2World, clock: SteppedClock | None = None, **provider: Any) -> Any:
    from gcs.autoscaler.providers.aws.provider import AwsProvider
    from gcs.autoscaler.providers.aws.session import Ec2

    clock = clock or SteppedClock()
    cluster = parse_cluster_config(cluster_yaml(**provider))
    ec2 = Ec2(world.provider_client(), clock)
    return AwsProvider(cluster, cluster.provider.settings, ec2, "10.0.0.5:6380", clock)  # type: ignore[arg-type]


def tags_of(inst: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


async def test_launch_tags_type_and_user_data(world: Ec2World) -> None:
    provider = provider_on(world)
    await provider.launch({"cpu": 2}, "req-1")
    assert provider.poll_errors() == []
    insts = world.instances(CLUSTER)
    assert len(insts) == 2
    for inst in insts:
        assert inst["InstanceType"] == "m5.large" and inst["ImageId"] == IMAGE
        tags = tags_of(inst)
        assert tags["ray-cluster-name"] == CLUSTER and tags["ray-user-node-type"] == "cpu"
        assert tags["ray-launch-request"] == "req-1" and tags["ray-node-type"] == "worker"
        script = world.user_data(inst["InstanceId"])
        lines = script.splitlines()
        assert lines[0] == "#!/bin/bash"
        # the setup commands, then ray start against this GCS with the instance's own id
        assert lines.index("echo setting up") < lines.index("pip list") < len(lines) - 1
        assert "meta-data/instance-id" in script and "export RAY_NODE_TYPE_NAME=cpu" in lines
        assert lines[-1] == "ray start --address=10.0.0.5:6380 --num-cpus=2 --labels=team=a"
        assert "pip install" not in script and "apt" not in script  # installs nothing
    listed = await provider.get_non_terminated()
    assert {ci.request_id for ci in listed.values()} == {"req-1"}


async def test_a_restarted_provider_replaying_a_launch_launches_nothing(world: Ec2World) -> None:
    """The request's tag is checked before launching: a GCS restarted after the call (its
    in-memory record gone) replays the launch and gets 0 duplicates."""
    await provider_on(world).launch({"cpu": 3}, "req-7")
    again = provider_on(world)
    await again.launch({"cpu": 3}, "req-7")
    assert len(world.instances(CLUSTER)) == 3 and again.poll_errors() == []
    await again.launch({"cpu": 1}, "req-8")  # a new request launches
    assert len(world.instances(CLUSTER)) == 4


async def test_zones_in_order_and_capacity_moves_to_the_next(world: Ec2World) -> None:
    provider = provider_on(world, availability_zone="us-west-2b,us-west-2a")
    subnets = {
        s["AvailabilityZone"]: s["SubnetId"] for s in world.client.describe_subnets()["Subnets"]
    }
    world.fail("RunInstances", "InsufficientInstanceCapacity",
               when=lambda p: p.get("SubnetId") == subnets["us-west-2b"])  # fmt: skip
    await provider.launch({"cpu": 2}, "req-1")
    assert provider.poll_errors() == []
    tried = [p.get("SubnetId") for p in world.proxy.log if p.get("Action") == "RunInstances"]
    assert tried == [subnets["us-west-2b"], subnets["us-west-2a"]]
    assert {i["Placement"]["AvailabilityZone"] for i in world.instances(CLUSTER)} == {"us-west-2a"}


@pytest.mark.parametrize(
    ("code", "kind", "subnets_tried"),
    [
        ("InsufficientInstanceCapacity", LaunchErrorKind.CAPACITY, 2),
        ("Unsupported", LaunchErrorKind.CAPACITY, 2),
        ("InstanceLimitExceeded", LaunchErrorKind.QUOTA, 1),
        ("InvalidAMIID.NotFound", LaunchErrorKind.ERROR, 1),
    ],
)
async def test_a_refused_launch_is_one_typed_error(
    world: Ec2World, code: str, kind: LaunchErrorKind, subnets_tried: int
) -> None:
    provider = provider_on(world, availability_zone="us-west-2a,us-west-2b")
    world.fail("RunInstances", code, times=9, message=f"no m5.large ({code})")
    await provider.launch({"cpu": 2}, "req-1")
    (err,) = provider.poll_errors()
    assert isinstance(err, LaunchNodeError)
    assert (err.node_type, err.count, err.request_id, err.kind) == ("cpu", 2, "req-1", kind)
    assert code in err.details and err.details.count(code) == subnets_tried * 2
    assert world.proxy.calls["RunInstances"] == subnets_tried
    assert world.instances(CLUSTER) == []


async def test_throttling_is_retried_with_backoff_on_the_injected_clock(world: Ec2World) -> None:
    clock = SteppedClock()
    provider = provider_on(world, clock)
    world.fail("RunInstances", "RequestLimitExceeded", times=2, status=503)
    start = clock.monotonic_s()
    launching = asyncio.ensure_future(provider.launch({"cpu": 1}, "req-1"))
    await clock.advance_when_sleeping(1.0)  # first backoff: 1 s
    await clock.advance_when_sleeping(2.0)  # then 2 s
    await asyncio.wait_for(launching, 60)
    assert clock.monotonic_s() - start == 3.0
    assert provider.poll_errors() == [] and len(world.instances(CLUSTER)) == 1
    assert provider.ec2.throttled == 2
    # said in words once (the reconciler turns each line into an autoscaler event)
    notices = provider.capabilities.notices
    assert notices() == ["EC2 throttled 2 calls (RequestLimitExceeded): retried with backoff"]
    assert notices() == []


async def test_throttled_past_the_retries_is_an_error(world: Ec2World) -> None:
    clock = SteppedClock()
    provider = provider_on(world, clock)
    world.fail("RunInstances", "RequestLimitExceeded", times=99, status=503)
    launching = asyncio.ensure_future(provider.launch({"cpu": 1}, "req-1"))
    for _ in range(5):
        await clock.advance_when_sleeping(20.0)
    await asyncio.wait_for(launching, 60)
    (err,) = provider.poll_errors()
    assert err.kind is LaunchErrorKind.ERROR and "RequestLimitExceeded" in err.details


async def test_a_spot_interruption_is_a_capacity_refusal_reported_once(world: Ec2World) -> None:
    provider = provider_on(world, cache_stopped_nodes=False)
    await provider.launch({"spot": 1}, "req-s")
    (cid,) = await provider.get_non_terminated()
    world.spot_interrupt(cid)
    assert await provider.get_non_terminated() == {}
    (err,) = provider.poll_errors()
    assert isinstance(err, LaunchNodeError) and err.kind is LaunchErrorKind.CAPACITY
    assert (err.node_type, err.request_id) == ("spot", "req-s")
    assert f"spot instance {cid}" in err.details and "interrupted by AWS" in err.details
    await provider.get_non_terminated()
    assert provider.poll_errors() == []


async def test_stopped_instances_are_reused(world: Ec2World) -> None:
    """cache_stopped_nodes (Ray's default): on-demand instances are stopped, spot ones
    terminated; the next launch of the type starts the stopped one again."""
    provider = provider_on(world)
    await provider.launch({"cpu": 1, "spot": 1}, "req-1")
    listed = await provider.get_non_terminated()
    by_type = {ci.node_type: cid for cid, ci in listed.items()}
    await provider.terminate(sorted(listed), "term-1")
    states = {i["InstanceId"]: i["State"]["Name"] for i in world.instances(CLUSTER)}
    assert states == {by_type["cpu"]: "stopped", by_type["spot"]: "terminated"}
    assert await provider.get_non_terminated() == {}
    await provider.launch({"cpu": 2}, "req-2")
    listed = await provider.get_non_terminated()
    assert by_type["cpu"] in listed and len(listed) == 2
    assert {ci.request_id for ci in listed.values()} == {"req-2"}
    assert world.proxy.calls["StartInstances"] == 1 and world.proxy.calls["RunInstances"] == 3


async def test_a_refused_termination_is_reported_per_instance(world: Ec2World) -> None:
    provider = provider_on(world, cache_stopped_nodes=False)
    await provider.launch({"cpu": 2}, "req-1")
    ids = sorted(await provider.get_non_terminated())
    world.fail("TerminateInstances", "UnauthorizedOperation", times=2,
               when=lambda p: ids[0] in p.values())  # fmt: skip
    await provider.terminate([*ids, "i-0000000000000dead"], "term-1")
    (err,) = provider.poll_errors()
    assert isinstance(err, TerminateNodeError) and err.cloud_instance_id == ids[0]
    assert set(await provider.get_non_terminated()) == {ids[0]}


async def test_listing_reads_every_page(world: Ec2World) -> None:
    provider = provider_on(world)
    provider.ec2.page_size = 5  # AWS's least MaxResults
    for n in range(12):  # moto pages by reservation (one per run_instances call)
        await provider.launch({"cpu": 2}, f"req-{n}")
    assert provider.poll_errors() == []
    mark = len(world.proxy.log)
    assert len(await provider.get_non_terminated()) == 24
    pages = [p for p in world.proxy.log[mark:] if p["Action"] == "DescribeInstances"]
    assert len(pages) == 3 and all("NextToken" in p for p in pages[1:])


def test_the_section_checks_its_keys() -> None:
    raw = cluster_yaml()
    with pytest.raises(ConfigError, match=r"^provider\.region: required"):
        parse_cluster_config({**raw, "provider": {"type": "aws"}})
    with pytest.raises(ConfigError, match=r"^provider\.cache_stopped_nodes: expected true"):
        parse_cluster_config({**raw, "provider": {**raw["provider"], "cache_stopped_nodes": 1}})
    bad = {**raw, "available_node_types": {"head": {"node_config": {"ImageId": IMAGE}}}}
    with pytest.raises(ConfigError, match=r"head\.node_config\.InstanceType: required"):
        parse_cluster_config(bad)
    # a key outside Ray's schema is an error; Ray's keys the provider does not act on are
    # accepted and named in the one warning
    with pytest.raises(ConfigError, match=r"^provider\.zone: unknown key"):
        parse_cluster_config({**raw, "provider": {**raw["provider"], "zone": "x"}})
    warned = parse_cluster_config({**raw, "provider": {**raw["provider"], "security_group": {}}})
    assert "provider.security_group" in " ".join(warned.warnings)
    ok = {**raw["provider"], "availability_zone": "us-west-2a, us-west-2b",
          "security_group": {"GroupName": "g"}, "use_internal_ips": True}  # fmt: skip
    settings = parse_cluster_config({**raw, "provider": ok}).provider.settings
    assert settings.availability_zones == ("us-west-2a", "us-west-2b")  # type: ignore[attr-defined]
    # Ray's default image for a node_config without one (its region table)
    ray_minimal = yaml.safe_load((EXAMPLES / "example-minimal.yaml").read_text())
    for node in ray_minimal["available_node_types"].values():
        node["resources"] = {"CPU": 2}  # written out: parsed, not resolved
    settings = parse_cluster_config(ray_minimal).provider.settings
    images = {t.node_config["ImageId"] for t in settings.node_types.values()}  # type: ignore[attr-defined]
    assert images == {"ami-0a2b85e15b7c0ac34"}
    elsewhere = {**ray_minimal, "provider": {"type": "aws", "region": "mars-north-1"}}
    with pytest.raises(ConfigError, match=r"ImageId: required \(no default image for region"):
        parse_cluster_config(elsewhere)


class TestResourcesHook:
    """The registry row's ``node_type_resources`` on moto's describe_instance_types."""

    @staticmethod
    async def resolve(world: Ec2World, raw: dict[str, Any]) -> dict[str, Any]:
        fill = pkgutil.resolve_name(PROVIDERS["aws"].node_type_resources)
        configs = {n: t.get("node_config") or {} for n, t in raw["available_node_types"].items()}
        with world.environment():
            return dict(await fill(raw["provider"], configs))

    async def test_ray_examples_instance_types_resolve(self, world: Ec2World) -> None:
        m5_large = {"CPU": 2.0, "memory": float(8192 * 1024 * 1024)}  # the whole instance's
        for name in ("example-minimal.yaml", "defaults.yaml"):
            raw = yaml.safe_load((EXAMPLES / name).read_text())
            got = await self.resolve(world, raw)
            assert set(got) == set(raw["available_node_types"]), name
            assert all(r == m5_large for r in got.values()), (name, got)

    async def test_gpus_by_gpu_info_and_accelerator_type(self, world: Ec2World) -> None:
        raw = yaml.safe_load((EXAMPLES / "example-gpu-docker.yaml").read_text())
        # Ray 2.60's GPU example asks for p2.xlarge, which EC2 (and moto) no longer offer:
        # an error naming it, as Ray's ValueError does
        with pytest.raises(ConfigError, match=r"ray\.head\.gpu\.node_config\.InstanceType: "
                           r"p2\.xlarge is not available in AWS region us-west-2"):  # fmt: skip
            await self.resolve(world, raw)
        raw["available_node_types"]["ray.head.gpu"]["node_config"]["InstanceType"] = "g5.xlarge"
        raw["available_node_types"]["ray.worker.default"]["node_config"]["InstanceType"] = (
            "inf2.xlarge"
        )
        got = await self.resolve(world, raw)
        assert got["ray.head.gpu"] == {
            "CPU": 4.0, "memory": float(16384 * 1024 * 1024), "GPU": 1.0,
            "accelerator_type:A10G": 1.0,
        }  # fmt: skip
        assert got["ray.worker.default"]["neuron_cores"] == 2.0
        assert got["ray.worker.default"]["accelerator_type:aws-neuron-core"] == 1.0


def test_user_data_carries_every_resource_and_label() -> None:
    """What the machine starts is what the node type says: Ray's own flags for CPU, GPU and
    memory, the rest (accelerator_type:*) as --resources JSON."""
    from gcs.autoscaler.providers.aws.userdata import user_data
    from tests.autoscaler.aws.machines import parse_user_data

    resources = {"CPU": 4.0, "GPU": 1.0, "memory": 12.5e9, "accelerator_type:A10G": 1.0}
    script = user_data(
        cluster="c", node_type="gpu", gcs_address="10.0.0.5:6380", resources=resources,
        labels={"zone": "a", "tier": "gpu"}, setup_commands=["nvidia-smi"],
    )  # fmt: skip
    boot = parse_user_data(script)
    assert (boot.gcs_address, boot.node_type, boot.resources) == ("10.0.0.5:6380", "gpu", resources)
    assert boot.labels == {"zone": "a", "tier": "gpu"} and boot.reads_instance_id
    assert script.splitlines()[-1] == (
        "ray start --address=10.0.0.5:6380 --num-cpus=4 --num-gpus=1 --memory=12500000000 "
        "'--resources={\"accelerator_type:A10G\":1.0}' --labels=tier=gpu,zone=a"
    )


def test_the_rows_defaults_are_rays_aws_defaults_yaml() -> None:
    """What the ``aws`` row merges under a YAML is Ray 2.60's ``aws/defaults.yaml``, as the
    wheel ships it (the copy in the test data)."""
    ray = yaml.safe_load((EXAMPLES / "defaults.yaml").read_text())
    assert defaults() == ray
    assert PROVIDERS["aws"].defaults.endswith("aws.defaults:defaults")


@pytest.mark.parametrize("name", ["example-minimal", "example-full"])
def test_plan_on_rays_yaml_against_the_ec2_api_matches_it_spelled_out(
    world: Ec2World, name: str, tmp_path: Path
) -> None:
    """``gcs autoscaler plan`` on Ray's AWS example, its resources read from (moto's) EC2 API
    by the real ``aws`` row, launches what the same cluster written out launches."""
    from click.testing import CliRunner

    from gcs.cli.main import main
    from tests.autoscaler.test_ray_cluster_yaml import _state_file
    from tests.autoscaler.toy_catalog import TOY_AWS_PROVIDERS

    state = _state_file(tmp_path, "ray.head.default", {"CPU": 2})
    plans = []
    for config, providers in (
        (EXAMPLES / f"{name}.yaml", PROVIDERS),
        (EXAMPLES / f"{name}.spelled-out.yaml", TOY_AWS_PROVIDERS),
    ):
        args = ["autoscaler", "plan", "--config", str(config), "--state", state]
        with world.environment():
            result = CliRunner().invoke(main, [*args, "--format", "json"], obj=providers)
        assert result.exit_code == 0, result.output
        plans.append(json.loads(result.stdout))
    assert plans[0]["launch"] == plans[1]["launch"] == {"ray.worker.default": 2}
    assert plans[0].get("terminate") == plans[1].get("terminate")
