"""The ``aws`` provider: the contract of :mod:`gcs.autoscaler.providers.base` on EC2.

Listing is one paginated ``describe_instances`` of the cluster's tag; pending and running
instances are its instances.  Terminated ones are read too, for one thing only: an instance
AWS took back (a spot interruption, ``StateReason`` ``Server.SpotInstanceTermination``) is
reported once as a capacity refusal of its node type, so the autoscaler holds the type
back and sends demand elsewhere, as for ``InsufficientInstanceCapacity``.  Terminating stops
on-demand instances instead when ``cache_stopped_nodes`` is on (spot ones cannot be
stopped: they are terminated), and a later launch starts them again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import structlog

from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.providers.aws import errors
from gcs.autoscaler.providers.aws.describe import LIVE, Ec2Instance, describe_cluster
from gcs.autoscaler.providers.aws.launch import Launcher
from gcs.autoscaler.providers.aws.session import Ec2, make_client
from gcs.autoscaler.providers.aws.settings import AwsSettings
from gcs.autoscaler.providers.aws.userdata import user_data
from gcs.autoscaler.providers.base import (
    Capabilities,
    CloudInstance,
    CloudUnavailable,
    LaunchErrorKind,
    LaunchNodeError,
    ProviderContext,
    ProviderError,
    TerminateNodeError,
)
from gcs.base.clock import Clock
from gcs.policy.autoscaling.model import NodeKind

__all__ = ["AwsProvider", "build"]

log = structlog.get_logger("gcs.autoscaler.providers")

_GONE = ("shutting-down", "terminated")
_REMEMBERED = 10_000
_TERMINATE_BATCH = 1000
"""Instance ids per terminate / stop call (Ray's ``max_terminate_nodes``)."""


class AwsProvider:
    """The head is the machine this GCS runs on (``ray up`` brought it up): never launched."""

    def __init__(
        self,
        cluster: ClusterConfig,
        settings: AwsSettings,
        ec2: Ec2,
        gcs_address: str,
        clock: Clock,
    ) -> None:
        self._cluster = cluster
        self._settings = settings
        self._ec2 = ec2
        self._gcs_address = gcs_address
        self._clock = clock
        self._launcher = Launcher(ec2, settings, cluster.cluster_name)
        self._done: dict[str, None] = {}
        """Request ids done by this process, the last ``_REMEMBERED`` (a replay after a
        restart is caught by the request's tag instead)."""
        self._errors: list[ProviderError] = []
        self._interrupted: set[str] = set()
        self._throttled_told = 0
        self.capabilities = Capabilities(notices=self._notices)

    def _notices(self) -> list[str]:
        """EC2's throttling since the last round, in words (its calls are retried with
        backoff meanwhile; past the last retry the call fails as an error)."""
        throttled = self._ec2.throttled - self._throttled_told
        self._throttled_told = self._ec2.throttled
        if not throttled:
            return []
        return [
            f"EC2 throttled {throttled} call{'s' if throttled > 1 else ''} "
            "(RequestLimitExceeded): retried with backoff"
        ]

    @property
    def ec2(self) -> Ec2:
        return self._ec2

    async def get_non_terminated(self) -> Mapping[str, CloudInstance]:
        try:
            found = await describe_cluster(
                self._ec2, self._cluster.cluster_name, states=(*LIVE, *_GONE)
            )
        except Exception as err:
            raise CloudUnavailable(f"aws: cannot list instances: {errors.describe(err)}") from err
        listed: dict[str, CloudInstance] = {}
        for inst in found:
            if inst.state in LIVE:
                kind = NodeKind.HEAD if inst.kind == "head" else NodeKind.WORKER
                listed[inst.instance_id] = CloudInstance(
                    inst.instance_id, inst.node_type, kind, inst.state == "running",
                    inst.request_id,
                )  # fmt: skip
            elif inst.state_reason in errors.SPOT_INTERRUPTED:
                self._interruption(inst)
        return listed

    def _interruption(self, inst: Ec2Instance) -> None:
        """Reported once per instance (the terminated instance stays listed for a while)."""
        if inst.instance_id in self._interrupted:
            return
        self._interrupted.add(inst.instance_id)
        why = (
            f"spot instance {inst.instance_id} ({inst.instance_type} in "
            f"{inst.zone or 'its zone'}) was interrupted by AWS ({inst.state_reason})"
        )
        self._errors.append(
            LaunchNodeError(
                inst.node_type, 1, inst.request_id, self._now_ns(), why, LaunchErrorKind.CAPACITY
            )
        )
        log.warning("aws.spot_interrupted", instance_id=inst.instance_id, node_type=inst.node_type)

    def _first_time(self, request_id: str) -> bool:
        if request_id in self._done:
            return False
        self._done[request_id] = None
        if len(self._done) > _REMEMBERED:
            del self._done[next(iter(self._done))]
        return True

    def _setup(self, node_type: str) -> tuple[str, ...]:
        """Ray's commands for a node of this type: initialization, then setup (the type's
        own lists replacing the cluster's, Ray's precedence; see ``Launcher``)."""
        launcher = self._cluster.launcher
        if node_type == self._cluster.head_node_type:
            return launcher.initialization(node_type) + launcher.head_setup()
        return launcher.initialization(node_type) + launcher.worker_setup(node_type)

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None:
        if not self._first_time(request_id):
            return
        for node_type, count in shape.items():
            if count <= 0:
                continue
            launch = self._settings.node_types.get(node_type)
            cfg = self._cluster.scheduler.node_types.get(node_type)
            if launch is None or cfg is None:
                self._fail(node_type, count, request_id, f"unknown node type {node_type!r}")
                continue
            script = user_data(
                cluster=self._cluster.cluster_name,
                node_type=node_type,
                gcs_address=self._gcs_address,
                resources=cfg.resources,
                labels=cfg.labels,
                setup_commands=self._setup(node_type),
            )
            kind = "head" if node_type == self._cluster.head_node_type else "worker"
            try:
                done = await self._launcher.launch(
                    node_type, count, request_id, kind=kind, launch=launch, user_data=script
                )
            except Exception as err:  # the request-id check or a subnet lookup failed
                self._fail(node_type, count, request_id, errors.describe(err),
                           errors.launch_kind(err))  # fmt: skip
                continue
            if done.started or done.created:
                log.info("aws.launched", node_type=node_type, request_id=request_id,
                         created=done.created, restarted=done.started)  # fmt: skip
            if done.missing:
                self._fail(node_type, done.missing, request_id, done.error, done.kind)

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None:
        if not self._first_time(request_id):
            return
        ids = sorted(set(cloud_instance_ids))
        stop: list[str] = []
        if self._settings.cache_stopped_nodes and ids:
            try:
                found = await self._ec2.pages(
                    "describe_instances", "Reservations",
                    Filters=[{"Name": "instance-id", "Values": ids}],
                )  # fmt: skip
            except Exception as err:
                for cid in ids:
                    self._errors.append(
                        TerminateNodeError(cid, request_id, self._now_ns(), errors.describe(err))
                    )
                return
            stop = sorted(
                i["InstanceId"]
                for r in found
                for i in r.get("Instances", [])
                if i.get("InstanceLifecycle") != "spot"
            )
        terminate = [cid for cid in ids if cid not in set(stop)]
        for operation, batch in (("stop_instances", stop), ("terminate_instances", terminate)):
            for start in range(0, len(batch), _TERMINATE_BATCH):
                await self._end(operation, batch[start : start + _TERMINATE_BATCH], request_id)

    async def _end(self, operation: str, ids: list[str], request_id: str) -> None:
        """One call for the batch; if it is refused, one per instance (an id AWS does not
        know fails the whole call, and is nothing left to do)."""
        if not ids:
            return
        try:
            await self._ec2.call(operation, InstanceIds=ids)
            return
        except Exception as err:
            if len(ids) == 1:
                if not errors.is_gone(err):
                    why = errors.describe(err)
                    self._errors.append(TerminateNodeError(ids[0], request_id, self._now_ns(), why))
                return
        for cid in ids:
            await self._end(operation, [cid], request_id)

    def poll_errors(self) -> list[ProviderError]:
        out, self._errors = self._errors, []
        return out

    def _fail(
        self,
        node_type: str,
        count: int,
        request_id: str,
        why: str,
        kind: LaunchErrorKind = LaunchErrorKind.ERROR,
    ) -> None:
        now_ns = self._now_ns()
        self._errors.append(LaunchNodeError(node_type, count, request_id, now_ns, why, kind))
        log.warning("provider.launch_failed", node_type=node_type, error=why, kind=kind.value)

    def _now_ns(self) -> int:
        return int(self._clock.now_s() * 1e9)


def build(context: ProviderContext) -> AwsProvider:
    settings = cast("AwsSettings", context.cluster.provider.settings)
    ec2 = Ec2(make_client(settings.region, settings.credentials), context.clock)
    return AwsProvider(context.cluster, settings, ec2, context.gcs_address, context.clock)
