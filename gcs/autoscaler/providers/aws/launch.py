"""Launching one node type under one request id.

In order: what this request already launched (found by its ``ray-launch-request`` tag, so a
restarted GCS replaying a launch never launches twice) is subtracted; with
``cache_stopped_nodes``, stopped instances of the type and the same launch config are started
again (and re-tagged with the request); the rest is ``run_instances`` in the node type's
subnets (or the availability zones' subnets) in order, each with a client token derived from
the request, so a retried call is answered with what the first one launched.  A capacity
refusal moves on to the next subnet; a quota refusal or another error stops there.  Each
call is all or nothing (``MinCount`` = ``MaxCount``), so a refusal leaves no partial launch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from gcs.autoscaler.providers.aws import errors
from gcs.autoscaler.providers.aws.describe import (
    ALL_STATES,
    TAG_CLUSTER,
    TAG_KIND,
    TAG_NODE_TYPE,
    TAG_REQUEST,
    describe_cluster,
)
from gcs.autoscaler.providers.aws.session import Ec2
from gcs.autoscaler.providers.aws.settings import AwsSettings, NodeLaunch
from gcs.policy.autoscaling.model import LaunchErrorKind

__all__ = ["TAG_LAUNCH_CONFIG", "Launched", "Launcher"]

log = structlog.get_logger("gcs.autoscaler.providers")

TAG_LAUNCH_CONFIG = "ray-launch-config"


@dataclass(slots=True)
class Launched:
    """What one launch did: instance ids started or created, and what failed."""

    started: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    missing: int = 0
    """Instances not launched (the error says why)."""
    error: str = ""
    kind: LaunchErrorKind = LaunchErrorKind.ERROR


def _token(*parts: str) -> str:
    """A ``ClientToken`` (at most 64 ASCII characters) unique to the parts."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:64]


def launch_config_hash(launch: NodeLaunch, user_data: str) -> str:
    """What makes a stopped instance reusable for a node type: the same node_config and
    the same boot script (Ray's ``ray-launch-config`` tag)."""
    body = json.dumps([dict(launch.node_config), user_data], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:40]


class Launcher:
    def __init__(self, ec2: Ec2, settings: AwsSettings, cluster: str) -> None:
        self._ec2 = ec2
        self._settings = settings
        self._cluster = cluster
        self._zone_subnets: list[str] | None = None

    async def subnets(self, launch: NodeLaunch) -> list[str]:
        """The subnets to try in order ([""]: let EC2 choose)."""
        if launch.subnets:
            return list(launch.subnets)
        zones = self._settings.availability_zones
        if not zones:
            return [""]
        if self._zone_subnets is None:
            found = await self._ec2.pages(
                "describe_subnets",
                "Subnets",
                Filters=[{"Name": "availability-zone", "Values": list(zones)}],
            )
            ordered = sorted(
                (s for s in found if s.get("State", "available") == "available"),
                key=lambda s: (zones.index(s["AvailabilityZone"]), s["SubnetId"]),
            )
            self._zone_subnets = [s["SubnetId"] for s in ordered]
        return list(self._zone_subnets) or [""]

    def _tags(self, node_type: str, kind: str, request_id: str, config_hash: str) -> list[dict]:
        return [
            {"Key": TAG_CLUSTER, "Value": self._cluster},
            {"Key": TAG_KIND, "Value": kind},
            {"Key": TAG_NODE_TYPE, "Value": node_type},
            {"Key": TAG_REQUEST, "Value": request_id},
            {"Key": TAG_LAUNCH_CONFIG, "Value": config_hash},
            {"Key": "Name", "Value": f"ray-{self._cluster}-{kind}"},
        ]

    async def launch(
        self,
        node_type: str,
        count: int,
        request_id: str,
        *,
        kind: str,
        launch: NodeLaunch,
        user_data: str,
    ) -> Launched:
        done = Launched()
        already = await describe_cluster(
            self._ec2,
            self._cluster,
            states=ALL_STATES,
            tags={TAG_REQUEST: request_id, TAG_NODE_TYPE: node_type},
        )
        count -= len(already)
        if count <= 0:
            return done
        config_hash = launch_config_hash(launch, user_data)
        if self._settings.cache_stopped_nodes:
            count -= await self._restart_stopped(node_type, count, request_id, config_hash, done)
        if count <= 0:
            return done
        tags = self._tags(node_type, kind, request_id, config_hash)
        await self._run(node_type, count, request_id, launch, user_data, tags, done)
        return done

    async def _restart_stopped(
        self, node_type: str, count: int, request_id: str, config_hash: str, done: Launched
    ) -> int:
        stopped = await describe_cluster(
            self._ec2,
            self._cluster,
            states=("stopped",),
            tags={TAG_NODE_TYPE: node_type, TAG_LAUNCH_CONFIG: config_hash},
        )
        ids = sorted(i.instance_id for i in stopped)[:count]
        if not ids:
            return 0
        try:
            await self._ec2.call("start_instances", InstanceIds=ids)
            await self._ec2.call(
                "create_tags", Resources=ids, Tags=[{"Key": TAG_REQUEST, "Value": request_id}]
            )
        except Exception as err:  # starting failed: launch new ones instead
            log.warning("aws.restart_failed", instance_ids=ids, error=errors.describe(err))
            return 0
        log.info("aws.restarted", node_type=node_type, instance_ids=ids)
        done.started.extend(ids)
        return len(ids)

    async def _run(
        self,
        node_type: str,
        count: int,
        request_id: str,
        launch: NodeLaunch,
        user_data: str,
        tags: list[dict],
        done: Launched,
    ) -> None:
        conf = _with_tags(dict(launch.node_config), tags)
        refusals: list[str] = []
        kind = LaunchErrorKind.ERROR
        for subnet in await self.subnets(launch):
            if count <= 0:
                break
            args: dict[str, Any] = {
                **conf,
                "MinCount": count,
                "MaxCount": count,
                "UserData": user_data,
                "ClientToken": _token(self._cluster, request_id, node_type, subnet),
            }
            if subnet and "NetworkInterfaces" not in conf:
                args["SubnetId"] = subnet
            try:
                reply = await self._ec2.call("run_instances", **args)
            except Exception as err:
                kind = errors.launch_kind(err)
                where = f" in {subnet}" if subnet else ""
                refusals.append(f"{errors.describe(err)}{where}")
                log.warning("aws.launch_refused", node_type=node_type, subnet=subnet,
                            error=errors.describe(err))  # fmt: skip
                if kind is LaunchErrorKind.CAPACITY:
                    continue  # another subnet / zone may have it
                break
            ids = [i["InstanceId"] for i in reply.get("Instances", [])]
            done.created.extend(ids)
            count -= len(ids)
        if count > 0:
            done.missing = count
            done.kind = kind
            done.error = "; ".join(refusals) or "the cloud launched fewer than asked"


def _with_tags(conf: dict[str, Any], tags: list[dict]) -> dict[str, Any]:
    """Our instance tags plus the node_config's own ``TagSpecifications`` (its instance tags
    join ours, never replacing a ``ray-*`` one; other resource types are kept)."""
    ours = {t["Key"] for t in tags}
    instance_tags = list(tags)
    others: list[Mapping[str, Any]] = []
    for spec in conf.pop("TagSpecifications", None) or []:
        if spec.get("ResourceType") == "instance":
            instance_tags += [t for t in spec.get("Tags", []) if t.get("Key") not in ours]
        else:
            others.append(spec)
    conf["TagSpecifications"] = [{"ResourceType": "instance", "Tags": instance_tags}, *others]
    return conf
