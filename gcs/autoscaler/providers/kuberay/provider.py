"""The KubeRay provider (Ray 2.60 §2.7, §3): the RayCluster is the cloud.

Every listing re-reads the RayCluster (config, ``ray.io/ippr``), lists its pods and rebuilds
each IPPR pod's resize state -- reads only.  What follows from a listing is written in the
:meth:`KubeRayProvider.upkeep` step the reconciler runs right after it: completed resizes
synced to the raylets, finished ``workersToDelete`` cleared, an idle cluster suspended or
deleted.  Scaling patches the RayCluster (the operator creates and deletes pods); every patch
carries a ``test`` op on ``metadata.resourceVersion`` and is retried on a fresh read when
someone else changed it first.  Resizes go through ``pods/<name>/resize``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, cast

import structlog

from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.providers.base import (
    Capabilities,
    CloudInstance,
    CloudUnavailable,
    LaunchNodeError,
    ProviderContext,
    ProviderError,
    TerminateNodeError,
)
from gcs.autoscaler.providers.kuberay.cluster import DEFAULT_IDLE_TIMEOUT_S, cluster_config
from gcs.autoscaler.providers.kuberay.connect import KubeRaySection, connect, initial_config
from gcs.autoscaler.providers.kuberay.downsize import UnusedClock, downsize_target
from gcs.autoscaler.providers.kuberay.ippr import (
    STATUS_ANNOTATION,
    IpprConfig,
    need_sync_with_raylet,
    parse_ippr,
    pod_status,
    resize_patch,
    status_annotation,
)
from gcs.autoscaler.providers.kuberay.k8s import KubeApi, KubeApiError
from gcs.base.clock import Clock
from gcs.policy.autoscaling.model import NodeKind, RayNode
from gcs.policy.autoscaling.scheduler.types import IpprStatus, Options, Resize

__all__ = ["KubeRayProvider", "build", "initial_config"]

log = structlog.get_logger("gcs.autoscaler.kuberay")

MAX_CONFLICT_RETRIES = 5
CAPPED = "Launch capped by maxReplicas limit."


IDLE_FINALIZER = "ray.io/idle-termination-cleanup-finalizer"


class KubeRayGcs(Protocol):
    """What the provider asks the GCS."""

    async def resize_raylet(
        self, node_id_hex: str, resources: Mapping[str, float]
    ) -> Mapping[str, float]:
        """GCS ``ResizeRayletResourceInstances``: the raylet's new totals."""
        ...

    async def live_drivers(self) -> int:
        """Drivers alive now (Ray-internal ones not counted)."""
        ...


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def _running(pod: Mapping[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and "running" in (statuses[0].get("state") or {})


class KubeRayProvider:
    def __init__(
        self,
        api: KubeApi,
        gcs: KubeRayGcs,
        clock: Clock,
        *,
        options: Options | None = None,
    ) -> None:
        self._api = api
        self._gcs = gcs
        self._clock = clock
        self._options = options
        self._cluster: ClusterConfig | None = None
        self.ippr = IpprConfig()
        self._pods: dict[str, dict[str, Any]] = {}
        self._statuses: dict[str, IpprStatus] = {}
        self._errors: list[ProviderError] = []
        self._done: set[str] = set()
        self._logged_errors: dict[str, str] = {}
        self._unused = UnusedClock()
        self._idle_timeout_s = DEFAULT_IDLE_TIMEOUT_S
        self._no_driver_since: float | None = None
        self.idle_terminated = False
        self._cr: Mapping[str, Any] | None = None
        """The RayCluster as last listed (what :meth:`upkeep` acts on)."""
        self._listed: set[str] = set()
        """Every pod of the last listing, those being deleted included."""
        self.capabilities = Capabilities(
            resizer=self, upkeep=self, config_source=self.current_config
        )

    # -- what the reconciler reads ----------------------------------------------------------
    def current_config(self) -> ClusterConfig | None:
        """The autoscaling config from the RayCluster as last read."""
        return self._cluster

    def ippr_statuses(self) -> Mapping[str, IpprStatus]:
        """Pod name -> resize state, for pods of IPPR groups."""
        return dict(self._statuses)

    # -- CloudProvider ---------------------------------------------------------------------
    async def get_non_terminated(self) -> Mapping[str, CloudInstance]:
        """Read the RayCluster and its pods (nothing is written)."""
        try:
            cr = await self._api.get_cluster()
            listed = await self._api.list_pods()
        except KubeApiError as err:
            raise CloudUnavailable(f"RayCluster {self._api.cluster_name}: {err}") from err
        self._set_ippr(parse_ippr(cr))
        pods = [p for p in listed if not p["metadata"].get("deletionTimestamp")]
        pods = [p for p in pods if _labels(p).get("ray.io/node-type") in ("head", "worker")]
        self._pods = {_name(p): p for p in pods}
        running = Counter(
            _labels(p).get("ray.io/group", "") for p in pods
            if _labels(p).get("ray.io/node-type") == "worker"
        )  # fmt: skip
        self._cluster = cluster_config(cr, self.ippr, running, self._options)
        idle = self._cluster.scheduler.idle_timeout_s
        self._idle_timeout_s = DEFAULT_IDLE_TIMEOUT_S if idle is None else idle
        now = self._clock.now_s()
        self._statuses = {}
        for p in pods:
            entry = self.ippr.groups.get(_labels(p).get("ray.io/group", ""))
            if entry is not None:
                self._statuses[_name(p)] = pod_status(p, entry.spec, now)
        self._unused.keep_only(set(self._statuses))
        self._cr, self._listed = cr, {_name(p) for p in listed}
        out = {}
        for p in pods:
            kind = NodeKind.HEAD if _labels(p)["ray.io/node-type"] == "head" else NodeKind.WORKER
            out[_name(p)] = CloudInstance(
                _name(p), _labels(p).get("ray.io/group", ""), kind, _running(p)
            )
        return out

    async def upkeep(self) -> None:
        """What the last listing calls for: completed resizes to the raylets, finished
        deletions cleared, idle termination.  Each part logs its failure and is tried again
        after the next listing."""
        if self._cr is None:
            return
        await self._sync_with_raylets()
        await self._clear_finished_deletes(self._cr, self._listed)
        await self._idle_termination(self._cr)

    def _set_ippr(self, ippr: IpprConfig) -> None:
        for group, error in ippr.errors.items():
            if self._logged_errors.get(group) != error:
                log.error("autoscaler.ippr_misconfigured", group=group, error=error)
        for group in self._logged_errors.keys() - ippr.errors.keys():
            log.info("autoscaler.ippr_fixed", group=group)
        self._logged_errors = dict(ippr.errors)
        self.ippr = ippr

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None:
        if request_id in self._done:
            return
        self._done.add(request_id)
        await self._scale(dict(shape), [], request_id)

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None:
        if request_id in self._done:
            return
        self._done.add(request_id)
        await self._scale({}, list(cloud_instance_ids), request_id)

    def poll_errors(self) -> list[ProviderError]:
        errors, self._errors = self._errors, []
        return errors

    # -- scaling -----------------------------------------------------------------------------
    def _fail(
        self, launches: Mapping[str, int], deletes: Sequence[str], request_id: str, why: str
    ) -> None:
        now = int(self._clock.now_s() * 1e9)
        for group, count in launches.items():
            if count > 0:
                self._errors.append(LaunchNodeError(group, count, request_id, now, why))
        for pod in deletes:
            self._errors.append(TerminateNodeError(pod, request_id, now, why))
        log.warning("provider.scale_failed", request_id=request_id, error=why)

    async def _scale(self, launches: dict[str, int], deletes: list[str], request_id: str) -> None:
        for group in list(launches):
            if group in self.ippr.errors:
                self._fail({group: launches.pop(group)}, [], request_id, self.ippr.errors[group])
        for _ in range(MAX_CONFLICT_RETRIES):
            try:
                cr = await self._api.get_cluster()
                pods = await self._api.list_pods()
                ops, capped, unknown = _scale_ops(cr, pods, launches, deletes)
                if unknown:
                    self._fail({g: launches.pop(g) for g in unknown}, [], request_id,
                               "no such worker group in the RayCluster")  # fmt: skip
                if ops is None:
                    self._fail(
                        launches, deletes, request_id,
                        "a previous scale-down is still deleting pods (workersToDelete); "
                        "retry later",
                    )  # fmt: skip
                    return
                if len(ops) > 1:
                    await self._api.json_patch_cluster(ops)
            except KubeApiError as err:
                if err.conflict:
                    continue
                self._fail(launches, deletes, request_id, str(err))
                return
            for group, count in capped.items():
                self._fail({group: count}, [], request_id, CAPPED)
            log.info("provider.scaled", launches=launches, deletes=deletes, request_id=request_id)
            return
        self._fail(launches, deletes, request_id, "RayCluster kept changing (409); retry later")

    async def _clear_finished_deletes(self, cr: Mapping[str, Any], existing: set[str]) -> None:
        ops: list[dict[str, Any]] = [_rv_test(cr)]
        for i, group in enumerate((cr.get("spec") or {}).get("workerGroupSpecs") or []):
            pending = (group.get("scaleStrategy") or {}).get("workersToDelete") or []
            if pending and not any(p in existing for p in pending):
                ops.append(_strategy_op(i, []))
        if len(ops) == 1:
            return
        try:
            await self._api.json_patch_cluster(ops)
        except KubeApiError as err:  # a conflict or an outage: next listing tries again
            log.info("provider.clear_deletes_deferred", error=str(err))

    async def _idle_termination(self, cr: Mapping[str, Any]) -> None:
        """``spec.idleTerminationOptions``: once no driver has been alive for
        ``timeoutSeconds``, Suspend (``spec.idleSuspend``) or Delete the RayCluster."""
        options = (cr.get("spec") or {}).get("idleTerminationOptions")
        if not options or self.idle_terminated or (cr.get("spec") or {}).get("idleSuspend"):
            self._no_driver_since = None
            return
        try:
            drivers = await self._gcs.live_drivers()
        except Exception as err:  # no answer: no decision this round
            log.warning("provider.driver_check_failed", error=str(err))
            return
        now = self._clock.now_s()
        if drivers:
            self._no_driver_since = None
            return
        if self._no_driver_since is None:
            self._no_driver_since = now
        timeout = float(options.get("timeoutSeconds", 0))
        if now - self._no_driver_since < timeout:
            return
        policy = str(options.get("policy") or "Suspend")
        try:
            if policy == "Delete":
                finalizers = list((cr.get("metadata") or {}).get("finalizers") or [])
                if IDLE_FINALIZER not in finalizers:
                    await self._api.json_patch_cluster(
                        [
                            _rv_test(cr),
                            {"op": "add", "path": "/metadata/finalizers",
                             "value": [*finalizers, IDLE_FINALIZER]},
                        ]
                    )  # fmt: skip
                await self._api.delete_cluster()
            else:
                await self._api.merge_patch_cluster({"spec": {"idleSuspend": True}})
        except KubeApiError as err:  # a conflict or an outage: the next listing decides again
            log.warning("provider.idle_termination_failed", policy=policy, error=str(err))
            return
        self.idle_terminated = True
        log.info("provider.idle_terminated", policy=policy, idle_s=now - self._no_driver_since)

    # -- in-place resize ---------------------------------------------------------------------
    async def _sync_with_raylets(self) -> None:
        """Completed resizes: the raylet's logical resources follow the pod, then the
        annotation says no resize is in flight."""
        for pod, st in list(self._statuses.items()):
            if not need_sync_with_raylet(st):
                continue
            try:
                await self._gcs.resize_raylet(
                    st.raylet_id, {"CPU": st.current_cpu, "memory": st.current_memory}
                )
                done = replace(st, resizing_at=None)
                await self._write_status(pod, done)
            except Exception as err:  # retried next listing
                log.warning("provider.raylet_sync_failed", pod=pod, error=str(err))
                continue
            self._statuses[pod] = done
            log.info(
                "provider.resize_synced", pod=pod, cpu=st.current_cpu, memory=st.current_memory
            )

    async def _write_status(self, pod: str, st: IpprStatus) -> None:
        await self._api.patch_pod_annotations(pod, {STATUS_ANNOTATION: status_annotation(st)})

    async def resize(self, resizes: Sequence[Resize], nodes: Sequence[RayNode]) -> None:
        """Carry out the scheduler's resizes (Ray's ``do_ippr_requests``), then give unused
        capacity back where a group has ``"downsize": true``."""
        touched = set()
        for r in resizes:
            pod = r.cloud_instance_id
            st = self._statuses.get(pod)
            if st is None or pod not in self._pods:
                continue
            touched.add(pod)
            await self._resize_one(pod, replace(st, raylet_id=r.ray_node_id or st.raylet_id),
                                   r.cpu, r.memory)  # fmt: skip
        await self._downsize(nodes, touched)

    async def _resize_one(self, pod: str, st: IpprStatus, cpu: float, memory: float) -> bool:
        shrink = cpu < st.current_cpu or memory < st.current_memory
        if shrink:
            # logical resources first, so nothing new lands on what goes away; the raylet
            # keeps what is in use and answers with what it kept
            try:
                got = await self._gcs.resize_raylet(
                    st.raylet_id,
                    {"CPU": min(cpu, st.current_cpu), "memory": min(memory, st.current_memory)},
                )
            except Exception as err:
                log.warning("provider.raylet_resize_failed", pod=pod, error=str(err))
                return False
            if "CPU" not in got or "memory" not in got:
                return False
            if cpu < st.current_cpu:
                cpu = float(got["CPU"])
            if memory < st.current_memory:
                memory = float(int(got["memory"]))
        try:
            await self._api.resize_pod(pod, resize_patch(self._pods[pod], cpu, memory))
        except KubeApiError as err:
            log.warning("provider.pod_resize_failed", pod=pod, error=str(err))
            if shrink:  # the pod keeps its size: so does the raylet
                await self._restore_logical(pod, st)
            return False
        sent = replace(
            st,
            desired_cpu=cpu,
            desired_memory=memory,
            resizing_at=float(int(self._clock.now_s())),
            k8s_resize_status=None,
        )
        try:
            await self._write_status(pod, sent)
        except KubeApiError as err:
            log.warning("provider.status_write_failed", pod=pod, error=str(err))
        self._statuses[pod] = sent
        log.info("provider.resize_sent", pod=pod, cpu=cpu, memory=memory)
        return True

    async def _restore_logical(self, pod: str, st: IpprStatus) -> None:
        try:
            await self._gcs.resize_raylet(
                st.raylet_id, {"CPU": st.current_cpu, "memory": st.current_memory}
            )
        except Exception as err:  # the next completed sync sets it again
            log.warning("provider.raylet_restore_failed", pod=pod, error=str(err))

    def _group_idle_timeout_s(self, group: str) -> float:
        """The group's ``idleTimeoutSeconds``, else the cluster's."""
        t = self._cluster.scheduler.node_types.get(group) if self._cluster else None
        return (
            t.idle_timeout_s
            if t is not None and t.idle_timeout_s is not None
            else (self._idle_timeout_s)
        )

    async def _downsize(self, nodes: Sequence[RayNode], skip: set[str]) -> None:
        now = self._clock.now_s()
        by_pod = {n.instance_id: n for n in nodes if n.instance_id}
        for pod, st in list(self._statuses.items()):
            group = _labels(self._pods.get(pod, {})).get("ray.io/group", "")
            entry = self.ippr.groups.get(group)
            node = by_pod.get(pod)
            if entry is None or not entry.downsize or node is None or pod in skip:
                self._unused.reset(pod)
                continue
            target = downsize_target(st, entry.spec, node.total, node.available)
            if not self._unused.due(pod, target, now, self._group_idle_timeout_s(group)):
                continue
            assert target is not None
            self._unused.reset(pod)
            log.info("provider.downsize", pod=pod, cpu=target.cpu, memory=target.memory)
            await self._resize_one(pod, replace(st, raylet_id=node.node_id), target.cpu,
                                   target.memory)  # fmt: skip


# -- RayCluster patches (pure) ---------------------------------------------------------------
def _rv_test(cr: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": cr["metadata"]["resourceVersion"],
    }


def _strategy_op(index: int, names: list[str]) -> dict[str, Any]:
    return {
        "op": "add",
        "path": f"/spec/workerGroupSpecs/{index}/scaleStrategy",
        "value": {"workersToDelete": names},
    }


def _scale_ops(
    cr: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    launches: Mapping[str, int],
    deletes: Sequence[str],
) -> tuple[list[dict[str, Any]] | None, dict[str, int], list[str]]:
    """JSON patch for one scale request (§2.7), the workers capped away per group, and
    launch groups the RayCluster lacks.  None while an earlier deletion is unfinished."""
    live = {
        _name(p): p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and _labels(p).get("ray.io/node-type") == "worker"
    }
    existing = {_name(p) for p in pods}  # pods being deleted still exist
    groups = (cr.get("spec") or {}).get("workerGroupSpecs") or []
    for group in groups:
        pending = (group.get("scaleStrategy") or {}).get("workersToDelete") or []
        if any(p in existing for p in pending):
            return None, {}, []
    names = {str(g.get("groupName")) for g in groups}
    unknown = [g for g in launches if g not in names]
    ops: list[dict[str, Any]] = [_rv_test(cr)]
    capped: dict[str, int] = {}
    for i, group in enumerate(groups):
        name = str(group.get("groupName"))
        hosts = max(1, int(group.get("numOfHosts") or 1))
        replicas = int(group.get("replicas") or 0)
        observed = sum(1 for p in live.values() if _labels(p).get("ray.io/group") == name)
        gone = sorted(
            p for p in deletes if p in live and _labels(live[p]).get("ray.io/group") == name
        )
        desired = max(max(replicas, int(group.get("minReplicas") or 0)) * hosts, observed)
        desired += launches.get(name, 0) - len(gone)
        want = math.ceil(max(0, desired) / hosts)
        top = int(group.get("maxReplicas", want))
        if want > top:
            capped[name] = (want - top) * hosts
            want = top
        if want != replicas:
            ops.append({"op": "add", "path": f"/spec/workerGroupSpecs/{i}/replicas", "value": want})
        if gone:
            ops.append(_strategy_op(i, gone))
    return ops, capped, unknown


def build(context: ProviderContext) -> KubeRayProvider:
    """The registry row's factory: the client comes from the row's own section."""
    api = connect(cast("KubeRaySection", context.cluster.provider.settings))
    return KubeRayProvider(
        api, context.gcs, context.clock, options=context.cluster.scheduler.options
    )
