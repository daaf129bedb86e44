"""One rig per provider for the contract suite: the provider plus a stand-in for its cloud.

A rig builds the provider over its world (processes of a stub raylet, the fake Kubernetes
API server with its operator, a fake GCS), counts the writes made to that world (so a test
can show that listing makes none), and can make the world misbehave where the provider's
cloud can: lose an instance behind the provider's back, refuse to be read, refuse a
termination.  ``RIGS`` must name every provider of the registry (a test checks it).
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.providers.base import CloudProvider, CloudUnavailable
from gcs.autoscaler.providers.command import CommandProvider, NodeCommands
from gcs.autoscaler.providers.local import LocalProvider
from gcs.autoscaler.providers.processes import ProcessRecords, kill_group, terminate_records
from gcs.autoscaler.providers.read_only import ReadOnlyProvider
from gcs.base.clock import SystemClock
from gcs.policy.autoscaling.model import NodeKind
from gcs.proto import autoscaler_pb2
from gcs.testing.cloud import FakeAutoscalerGcs, FakeCloudProvider
from gcs.testing.fake_k8s import ApiError
from tests.autoscaler.clock import SteppedClock
from tests.autoscaler.kuberay_harness import KubeRayHarness, raycluster, worker_group
from tests.autoscaler.toy_provider import ToyProvider

CLUSTER = parse_cluster_config(
    {
        "max_workers": 10,
        "provider": {"type": "local"},
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "max_workers": 0},
            "cpu": {"resources": {"CPU": 2}, "max_workers": 10},
        },
    }
)


class Rig:
    """The reference shape every rig fills in."""

    name = ""
    node_type = "cpu"
    tags_request_ids = True
    """Listed instances carry the launch's request id (KubeRay pods cannot)."""
    section: dict[str, Any] = {}
    """The provider's own keys in a cluster YAML for this rig's world."""
    node_config: dict[str, Any] = {"start_command": "true"}
    """A node type's ``node_config`` the provider takes (the command provider's start
    command, an EC2 instance type and image)."""

    def __init__(self, provider: CloudProvider) -> None:
        self.provider = provider

    def env(self) -> dict[str, str]:
        """Environment the registry row's factory reads to reach this world (KubeRay:
        ``KUBECONFIG``)."""
        return {}

    def writes(self) -> object:
        """A value that changes whenever anything is written to the provider's world."""
        raise NotImplementedError

    async def lose(self, cloud_instance_id: str) -> bool:
        """The instance goes away behind the provider's back; False if it cannot."""
        return False

    def break_listing(self) -> bool:
        """The next listing cannot read the cloud; False if this cloud cannot fail so."""
        return False

    async def launch_unterminable(self, request_id: str) -> str | None:
        """Launch one instance whose termination will fail; None if it cannot."""
        return None

    async def close(self) -> None:
        return None


class FakeRig(Rig):
    """The reference: the recording fake of ``gcs.testing.cloud``."""

    name = "fake"

    def __init__(self, tmp: Path) -> None:
        self.fake = FakeCloudProvider(SteppedClock(), node_types={"head", "cpu"})
        super().__init__(self.fake)

    def writes(self) -> object:
        return (len(self.fake.launch_calls), len(self.fake.terminate_calls))

    async def lose(self, cloud_instance_id: str) -> bool:
        self.fake.instances.pop(cloud_instance_id)
        return True

    def break_listing(self) -> bool:
        self.fake.raise_on_list = CloudUnavailable("fake cloud: down")
        return True

    async def launch_unterminable(self, request_id: str) -> str | None:
        await self.fake.launch({"cpu": 1}, request_id)
        (cid,) = [c for c, i in self.fake.instances.items() if i.request_id == request_id]
        self.fake.next_terminate_error = "the cloud refused"
        return cid


def _tree(root: Path) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*")))


class LocalRig(Rig):
    """Real processes of a stub "python" that ignores ``-m gcs raylet ...`` and sleeps."""

    name = "local"

    def __init__(self, tmp: Path) -> None:
        stub = tmp / "stub-python"
        stub.write_text("#!/bin/sh\nexec sleep 300\n")
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
        self.state = tmp / "local"
        super().__init__(LocalProvider(CLUSTER, "127.0.0.1:1", self.state, python=str(stub)))

    def writes(self) -> object:
        return _tree(self.state)

    async def lose(self, cloud_instance_id: str) -> bool:
        await kill_group(ProcessRecords(self.state).load()[cloud_instance_id].pid, SystemClock())
        return True

    async def close(self) -> None:
        records = ProcessRecords(self.state)
        await terminate_records(records, sorted(records.load()), SystemClock())


class CommandRig(Rig):
    """Start commands that daemonize (exit 0 at once): tracked by record until stopped."""

    name = "command"

    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "command"
        commands = {
            "head": NodeCommands("true", "true"),
            "cpu": NodeCommands("true", "true"),
            "stuck": NodeCommands("true", "false"),
        }
        super().__init__(CommandProvider(commands, "127.0.0.1:1", self.state))

    def writes(self) -> object:
        return _tree(self.state)

    async def launch_unterminable(self, request_id: str) -> str | None:
        await self.provider.launch({"stuck": 1}, request_id)
        listed = await self.provider.get_non_terminated()
        (cid,) = [c for c, i in listed.items() if i.node_type == "stuck"]
        return cid


class ReadOnlyRig(Rig):
    """The GCS's node table is the cloud: one head node and one worker."""

    name = "read-only"

    def __init__(self, tmp: Path) -> None:
        self.gcs = FakeAutoscalerGcs()
        for n, (node_type, total) in enumerate(
            [("head", {"node:__internal_head__": 1.0}), ("cpu", {"CPU": 2.0})], start=1
        ):
            self.gcs.state.node_states.add(
                node_id=bytes([n]) * 28,
                ray_node_type_name=node_type,
                status=autoscaler_pb2.IDLE,
                total_resources=total,
            )
        super().__init__(ReadOnlyProvider(self.gcs))

    def writes(self) -> object:
        g = self.gcs
        return (len(g.reports), len(g.drains), len(g.stops), len(g.releases), dict(g.kv))

    async def lose(self, cloud_instance_id: str) -> bool:
        nodes = self.gcs.state.node_states
        (ns,) = [ns for ns in nodes if ns.node_id.hex() == cloud_instance_id]
        ns.status = autoscaler_pb2.DEAD
        return True

    def break_listing(self) -> bool:
        self.gcs.unavailable = True
        return True


class KubeRayRig(Rig):
    """The fake Kubernetes API server and its operator, a RayCluster of one worker group."""

    name = "kuberay"
    node_type = "small-group"
    tags_request_ids = False

    def __init__(self, tmp: Path) -> None:
        self.h = KubeRayHarness(raycluster(worker_group(replicas=0, max_replicas=10)))
        self.kubeconfig = self.h.k8s.write_kubeconfig(tmp / "kubeconfig")
        self.section = {"cluster_name": self.h.name}
        super().__init__(self.h.provider)

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)}

    def writes(self) -> object:
        k8s = [r for r in self.h.k8s.requests if r[0] != "GET"]
        return (len(k8s), len(self.h.ray.resize_calls))

    async def lose(self, cloud_instance_id: str) -> bool:
        def scale_down(cr: dict[str, Any]) -> None:  # someone else does it (kubectl edit)
            group = cr["spec"]["workerGroupSpecs"][0]
            group["replicas"] -= 1
            group["scaleStrategy"] = {"workersToDelete": [cloud_instance_id]}

        self.h.k8s.edit_raycluster(self.h.name, scale_down)
        return True

    def break_listing(self) -> bool:
        self.h.k8s.fail_next["GET rayclusters/" + self.h.name] = ApiError(
            503, "ServiceUnavailable", "etcd down"
        )
        return True

    async def launch_unterminable(self, request_id: str) -> str | None:
        before = set(await self.provider.get_non_terminated())
        await self.provider.launch({self.node_type: 1}, request_id)
        (cid,) = set(await self.provider.get_non_terminated()) - before
        self.h.k8s.fail_next["PATCH rayclusters/" + self.h.name] = ApiError(
            500, "InternalError", "etcd down"
        )
        return cid

    async def close(self) -> None:
        self.h.stop()


class ToyRig(Rig):
    name = "toy"

    def __init__(self, tmp: Path) -> None:
        kinds = {"head": NodeKind.HEAD, "cpu": NodeKind.WORKER}
        self.toy = ToyProvider(kinds, SteppedClock())
        super().__init__(self.toy)

    def writes(self) -> object:
        return len(self.toy._done)

    async def lose(self, cloud_instance_id: str) -> bool:
        del self.toy.instances[cloud_instance_id]
        return True


class AwsRig(Rig):
    """moto's EC2 server behind the fault proxy (``tests.autoscaler.aws.cloud``)."""

    name = "aws"
    section = {"region": "us-west-2", "availability_zone": "us-west-2a,us-west-2b"}
    node_config = {"InstanceType": "m5.large", "ImageId": "ami-12c6146b"}

    def __init__(self, tmp: Path) -> None:
        from gcs.autoscaler.providers.aws.provider import AwsProvider
        from gcs.autoscaler.providers.aws.session import Ec2
        from tests.autoscaler.aws.cloud import shared_world

        self.world = shared_world()
        node = {"resources": {"CPU": 2}, "node_config": self.node_config}
        cluster = parse_cluster_config(
            {
                "provider": {"type": "aws", **self.section},
                "head_node_type": "head",
                "available_node_types": {"head": {**node, "resources": {}}, "cpu": node},
            }
        )
        settings = cluster.provider.settings
        clock = SteppedClock()
        ec2 = Ec2(self.world.provider_client(), clock)
        super().__init__(AwsProvider(cluster, settings, ec2, "127.0.0.1:1", clock))  # type: ignore[arg-type]

    def env(self) -> dict[str, str]:
        return self.world.env()

    def writes(self) -> object:
        return self.world.writes()

    async def lose(self, cloud_instance_id: str) -> bool:
        self.world.client.terminate_instances(InstanceIds=[cloud_instance_id])
        return True

    def break_listing(self) -> bool:
        self.world.fail("DescribeInstances", "InternalError", status=500)
        return True

    async def launch_unterminable(self, request_id: str) -> str | None:
        before = set(await self.provider.get_non_terminated())
        await self.provider.launch({self.node_type: 1}, request_id)
        (cid,) = set(await self.provider.get_non_terminated()) - before
        self.world.fail("StopInstances", "UnauthorizedOperation", message="not allowed")
        return cid

    async def close(self) -> None:
        self.world.fresh()


RIGS: dict[str, Callable[[Path], Rig]] = {
    rig.name: rig
    for rig in (FakeRig, LocalRig, CommandRig, ReadOnlyRig, KubeRayRig, ToyRig, AwsRig)
}
