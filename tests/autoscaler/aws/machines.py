"""The test plays the machines: each EC2 instance moto runs boots its user data the way
cloud-init would -- here as an in-process ``gcs raylet`` agent (:class:`RayletAgent`) with the
instance's id, node type, resources, labels and GCS address read from that user data.

An instance AWS stops or terminates loses its raylet; an instance in ``never_boot`` runs in
EC2 but its raylet never comes up (a broken image).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from gcs.raylet.agent import RayletAgent, RayletConfig
from tests.autoscaler.aws.cloud import Ec2World

_FLAGS = {"--num-cpus": "CPU", "--num-gpus": "GPU", "--memory": "memory"}


@dataclass(frozen=True)
class Boot:
    """What a user data script starts."""

    gcs_address: str
    node_type: str
    resources: dict[str, float]
    labels: dict[str, str]
    reads_instance_id: bool


def parse_user_data(script: str) -> Boot:
    """The ``ray start`` line and the exports before it (what the shell would run)."""
    env: dict[str, str] = {}
    start: list[str] = []
    for line in script.splitlines():
        if line.startswith("export RAY_NODE_TYPE_NAME="):
            env["RAY_NODE_TYPE_NAME"] = shlex.split(line.split("=", 1)[1])[0]
        if line.startswith("export RAY_CLOUD_INSTANCE_ID=$(curl"):
            env["RAY_CLOUD_INSTANCE_ID"] = "meta-data/instance-id" in line
        if line.startswith("ray start "):
            start = shlex.split(line)
    assert start, f"no ray start in the user data:\n{script}"
    args = dict(a.split("=", 1) for a in start[2:])
    resources = {name: float(args[flag]) for flag, name in _FLAGS.items() if flag in args}
    resources.update(json.loads(args.get("--resources", "{}")))
    pairs = args["--labels"].split(",") if "--labels" in args else []
    labels = dict(kv.split("=", 1) for kv in pairs)
    return Boot(
        args["--address"], str(env["RAY_NODE_TYPE_NAME"]), resources, labels,
        bool(env.get("RAY_CLOUD_INSTANCE_ID")),
    )  # fmt: skip


@dataclass
class Machines:
    world: Ec2World
    cluster: str
    never_boot: set[str] = field(default_factory=set)
    broken_next: int = 0
    """The next this many instances to boot never do (they join ``never_boot``)."""
    agents: dict[str, RayletAgent] = field(default_factory=dict)
    booted: list[str] = field(default_factory=list)
    """Every instance that ever booted, in order (again after a stop and start)."""
    _up: set[str] = field(default_factory=set)
    """Instances booted since they last started: a raylet that exits (drained) leaves its
    machine running without Ray, as cloud-init runs the script once per boot."""

    async def step(self) -> None:
        """Boot what runs and has no raylet; stop the raylets of what no longer runs."""
        found = self.world.instances(self.cluster)
        states = {i["InstanceId"]: i["State"]["Name"] for i in found}
        heads = {
            i["InstanceId"]
            for i in found
            if {"Key": "ray-node-type", "Value": "head"} in i.get("Tags", [])
        }  # the head machine runs this GCS and its raylet (the test starts that one)
        for iid, agent in list(self.agents.items()):
            if states.get(iid) != "running" or agent.exit_reason is not None:
                await agent.stop()
                del self.agents[iid]
        self._up &= {iid for iid, state in states.items() if state == "running"}
        for iid, state in sorted(states.items()):
            if state != "running" or iid in self._up or iid in self.never_boot or iid in heads:
                continue
            if self.broken_next > 0:
                self.broken_next -= 1
                self.never_boot.add(iid)
                continue
            boot = parse_user_data(self.world.user_data(iid))
            agent = RayletAgent(
                RayletConfig(
                    gcs_address=boot.gcs_address,
                    resources=boot.resources,
                    node_type=boot.node_type,
                    labels=boot.labels,
                    instance_id=iid,  # what the script reads from the metadata service
                    node_name=iid,
                )
            )
            await agent.start()
            self.agents[iid] = agent
            self._up.add(iid)
            self.booted.append(iid)

    async def close(self) -> None:
        for agent in self.agents.values():
            await agent.stop()
        self.agents.clear()


def head_instance(world: Ec2World, cluster: str, image: str) -> str:
    """The head machine ``ray up`` launched (tagged as Ray's launcher tags it)."""
    reply: Any = world.client.run_instances(
        ImageId=image, InstanceType="m5.large", MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": "ray-cluster-name", "Value": cluster},
            {"Key": "ray-node-type", "Value": "head"},
            {"Key": "ray-user-node-type", "Value": "head"},
        ]}],
    )  # fmt: skip
    return str(reply["Instances"][0]["InstanceId"])
