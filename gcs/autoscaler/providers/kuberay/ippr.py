"""In-place pod resize (IPPR): the ``ray.io/ippr`` annotation and each pod's resize state.

Pure functions over RayCluster / Pod dicts (as the API returns them), Ray 2.60 §3:

- :func:`parse_ippr` reads the annotation and validates each group against its RayCluster
  entry.  A bad group gets one error naming the group and the rule; the others still work.
- :func:`pod_status` builds a pod's :class:`IpprStatus` from its spec, container status,
  resize conditions and ``ray.io/ippr-status`` annotation, and decides failures (a resize
  that errored, or is older than ``resize-timeout``): the failure is recorded once and a
  revert to the pod's current size is queued.
- :func:`resize_patch` / :func:`status_annotation` are what the provider writes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gcs.autoscaler.config import ConfigError, quantity
from gcs.policy.autoscaling.scheduler.types import IpprSpec, IpprStatus

IPPR_ANNOTATION = "ray.io/ippr"
STATUS_ANNOTATION = "ray.io/ippr-status"
HEAD_GROUP = "headgroup"
_ENTRY_KEYS = ("max-cpu", "max-memory", "resize-timeout")
_OPTIONAL_KEYS = ("downsize",)


@dataclass(frozen=True)
class GroupIppr:
    spec: IpprSpec
    #: Beyond Ray: give unused extra capacity back (``"downsize": true``).
    downsize: bool = False


@dataclass(frozen=True)
class IpprConfig:
    groups: Mapping[str, GroupIppr] = field(default_factory=dict)
    #: Misconfigured groups -> the error naming the group and the rule broken.
    errors: Mapping[str, str] = field(default_factory=dict)


class IpprGroupError(ValueError):
    pass


def group_specs(cr: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """groupName -> its spec (``headgroup`` for the head group)."""
    spec = cr.get("spec") or {}
    out: dict[str, Mapping[str, Any]] = {}
    if spec.get("headGroupSpec") is not None:
        out[HEAD_GROUP] = spec["headGroupSpec"]
    for g in spec.get("workerGroupSpecs") or []:
        out[str(g.get("groupName", ""))] = g
    return out


def parse_ippr(cr: Mapping[str, Any] | None) -> IpprConfig:
    """The annotation of ``cr``, validated per group; absent annotation -> IPPR off."""
    if cr is None:
        return IpprConfig()
    raw = ((cr.get("metadata") or {}).get("annotations") or {}).get(IPPR_ANNOTATION)
    if raw is None:
        return IpprConfig()
    groups = group_specs(cr)
    try:
        doc = json.loads(raw)
    except ValueError as err:
        msg = f"{IPPR_ANNOTATION}: not valid JSON ({err})"
        return IpprConfig(errors={g: msg for g in groups if g != HEAD_GROUP})
    entries = doc.get("groups") if isinstance(doc, dict) else None
    if not isinstance(entries, dict):
        msg = f'{IPPR_ANNOTATION}: expected {{"groups": {{<groupName>: {{...}}}}}}'
        return IpprConfig(errors={g: msg for g in groups if g != HEAD_GROUP})
    ok: dict[str, GroupIppr] = {}
    errors: dict[str, str] = {}
    for name, entry in entries.items():
        group = groups.get(name)
        if group is None:
            continue  # as Ray: entries for groups the RayCluster lacks are ignored
        try:
            ok[name] = _group(name, entry, group)
        except IpprGroupError as err:
            errors[name] = str(err)
    return IpprConfig(ok, errors)


def _group(name: str, entry: Any, group: Mapping[str, Any]) -> GroupIppr:
    where = f"{IPPR_ANNOTATION} group {name!r}"
    if not isinstance(entry, dict):
        raise IpprGroupError(f"{where}: expected an object with {', '.join(_ENTRY_KEYS)}")
    for key in _ENTRY_KEYS:
        if key not in entry:
            raise IpprGroupError(f"{where}: {key} is required")
    unknown = sorted(k for k in entry if k not in _ENTRY_KEYS + _OPTIONAL_KEYS)
    if unknown:
        raise IpprGroupError(f"{where}: unknown key {unknown[0]}")
    try:
        max_cpu = quantity(entry["max-cpu"], "max-cpu")
        max_memory = float(int(quantity(entry["max-memory"], "max-memory")))
    except ConfigError as err:
        raise IpprGroupError(f"{where}: {err}") from None
    timeout = entry["resize-timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
        raise IpprGroupError(
            f"{where}: resize-timeout must be a positive integer (seconds), got {timeout!r}"
        )
    downsize = entry.get("downsize", False)
    if not isinstance(downsize, bool):
        raise IpprGroupError(f"{where}: downsize must be true or false, got {downsize!r}")
    params = group.get("rayStartParams") or {}
    for key in ("num-cpus", "memory"):
        if key in params:
            raise IpprGroupError(
                f"{where}: rayStartParams must not set {key} (IPPR changes the pod's size; "
                f"a fixed {key} would drift from it)"
            )
    container = _container(group)
    requests = (container.get("resources") or {}).get("requests") or {}
    for res in ("cpu", "memory"):
        if res not in requests:
            raise IpprGroupError(
                f"{where}: the Ray container must set resources.requests.{res} "
                f"(IPPR resizes from it)"
            )
    for policy in container.get("resizePolicy") or []:
        if policy.get("resourceName") in ("cpu", "memory"):
            restart = policy.get("restartPolicy", "NotRequired")
            if restart != "NotRequired":
                raise IpprGroupError(
                    f"{where}: resizePolicy for {policy['resourceName']} must use "
                    f"restartPolicy NotRequired, got {restart}"
                )
    size = template_size(container)
    return GroupIppr(
        IpprSpec(
            max_cpu=max_cpu,
            max_memory=max_memory,
            min_cpu=size[0],
            min_memory=size[1],
            resize_timeout_s=timeout,
        ),
        downsize,
    )


def _container(group: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    return containers[0]  # type: ignore[no-any-return]


def _size(resources: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """(cpu cores, memory bytes): the limit if set, else the request."""
    resources = resources or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    out: list[float | None] = []
    for res in ("cpu", "memory"):
        value = limits.get(res, requests.get(res))
        out.append(None if value is None else quantity(value, res))
    return out[0], out[1]


def template_size(container: Mapping[str, Any]) -> tuple[float, float]:
    cpu, mem = _size(container.get("resources"))
    return cpu or 0.0, float(int(mem or 0))


# -- per-pod state ------------------------------------------------------------------------
def queue_resize(
    st: IpprStatus, cpu: float | None = None, memory: float | None = None
) -> IpprStatus:
    """Ray's ``queue_resize_request``: only differing values change; then status "new"."""
    new_cpu = st.desired_cpu if cpu is None else cpu
    new_mem = st.desired_memory if memory is None else memory
    if new_cpu == st.desired_cpu and new_mem == st.desired_memory:
        return st
    return replace(
        st, desired_cpu=new_cpu, desired_memory=new_mem, resizing_at=None, k8s_resize_status="new"
    )


def need_sync_with_raylet(st: IpprStatus) -> bool:
    return (
        bool(st.raylet_id)
        and st.resizing_at is not None
        and st.k8s_resize_status is None
        and st.desired_cpu == st.current_cpu
        and st.desired_memory == st.current_memory
    )


_DEFERRED = re.compile(
    r"Node didn't have enough resource: (cpu|memory), requested: (\d+), used: (\d+), "
    r"capacity: (\d+)"
)
_INFEASIBLE = re.compile(
    r"Node didn't have enough capacity: (cpu|memory), requested: (\d+), capacity: (\d+)"
)


def _suggested(pod: Mapping[str, Any], message: str) -> tuple[str, float] | None:
    """Largest size the node can give, from a PodResizePending message (§3.2)."""
    m = _DEFERRED.search(message)
    if m:
        res, capacity, used = m.group(1), float(m.group(4)), float(m.group(3))
    else:
        m = _INFEASIBLE.search(message)
        if not m:
            return None
        res, capacity, used = m.group(1), float(m.group(3)), 0.0
    free = capacity - used
    if res == "cpu":
        free /= 1000.0
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    resources = statuses[0].get("resources") or {}
    limit = (resources.get("limits") or {}).get(res)
    request = (resources.get("requests") or {}).get(res)
    gap = 0.0
    if limit is not None and request is not None:
        gap = quantity(limit, res) - quantity(request, res)
    others = 0.0
    for c in ((pod.get("spec") or {}).get("containers") or [])[1:]:
        value = ((c.get("resources") or {}).get("requests") or {}).get(res)
        if value is not None:
            others += quantity(value, res)
    return res, free + gap - others


def _annotation(pod: Mapping[str, Any]) -> dict[str, Any]:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(STATUS_ANNOTATION)
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def pod_status(pod: Mapping[str, Any], spec: IpprSpec, now_s: float) -> IpprStatus:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    want_cpu, want_mem = _size(containers[0].get("resources"))
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    cur_cpu, cur_mem = _size(statuses[0].get("resources"))
    desired_cpu, desired_mem = want_cpu or 0.0, float(int(want_mem or 0))
    current_cpu = desired_cpu if cur_cpu is None else cur_cpu
    current_mem = desired_mem if cur_mem is None else float(int(cur_mem))
    ann = _annotation(pod)
    reason = ann.get("last-failed-reason")
    st = IpprStatus(
        current_cpu=current_cpu,
        current_memory=current_mem,
        desired_cpu=desired_cpu,
        desired_memory=desired_mem,
        resizing_at=_num(ann.get("resizing-at")),
        suggested_max_cpu=_num(ann.get("suggested-max-cpu")),
        suggested_max_memory=_num(ann.get("suggested-max-memory")),
        last_failed_at=_num(ann.get("last-failed-at")),
        last_failed_reason=reason if isinstance(reason, str) else None,
        raylet_id=str(ann.get("raylet-id") or ""),
    )
    message = ""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "PodResizePending":
            st = replace(st, k8s_resize_status=str(cond.get("reason", "")).lower() or "pending")
            found = _suggested(pod, str(cond.get("message", "")))
            if found is not None:
                res, value = found
                if res == "cpu":
                    st = replace(st, suggested_max_cpu=value)
                    st = queue_resize(st, cpu=value)
                else:
                    st = replace(st, suggested_max_memory=float(int(value)))
                    st = queue_resize(st, memory=float(int(value)))
        elif cond.get("type") == "PodResizeInProgress":
            errored = cond.get("reason") == "Error"
            st = replace(st, k8s_resize_status="error" if errored else "inprogress")
            message = str(cond.get("message") or "") if errored else ""
    timed_out = (
        st.resizing_at is not None
        and not need_sync_with_raylet(st)
        and st.resizing_at + spec.resize_timeout_s < now_s
    )
    if st.k8s_resize_status == "error" or timed_out:
        if st.last_failed_at is None:
            why = message or (
                "Pod resize failed" if st.k8s_resize_status == "error" else "Pod resize timed out"
            )
            st = replace(st, last_failed_at=now_s, last_failed_reason=why)
        st = queue_resize(st, cpu=st.current_cpu, memory=st.current_memory)
    return st


def status_annotation(st: IpprStatus) -> str:
    """``ray.io/ippr-status``: every key present, null when unset."""
    return json.dumps(
        {
            "raylet-id": st.raylet_id or None,
            "resizing-at": None if st.resizing_at is None else int(st.resizing_at),
            "suggested-max-cpu": st.suggested_max_cpu,
            "suggested-max-memory": st.suggested_max_memory,
            "last-failed-at": None if st.last_failed_at is None else int(st.last_failed_at),
            "last-failed-reason": st.last_failed_reason,
        },
        sort_keys=True,
    )


def cpu_text(cores: float) -> str:
    milli = round(cores * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_text(num_bytes: float) -> str:
    return str(int(num_bytes))


def resize_patch(pod: Mapping[str, Any], cpu: float, memory: float) -> list[dict[str, Any]]:
    """JSON patch for ``pods/<name>/resize`` (§3.5): where the running container has a limit,
    the limit becomes the target and the request keeps its gap below it; else the request."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    actual = statuses[0].get("resources") or {}
    spec_res = (((pod.get("spec") or {}).get("containers") or [{}])[0].get("resources")) or {}
    ops: list[dict[str, Any]] = []
    for part in ("limits", "requests"):
        if part not in spec_res:
            ops.append({"op": "add", "path": f"/spec/containers/0/resources/{part}", "value": {}})
    for res, target, text in (("cpu", cpu, cpu_text), ("memory", memory, memory_text)):
        limit = (actual.get("limits") or {}).get(res)
        request = (actual.get("requests") or {}).get(res)
        if limit is not None:
            gap = quantity(limit, res) - (quantity(request, res) if request is not None else 0.0)
            ops.append(
                {
                    "op": "add",
                    "path": f"/spec/containers/0/resources/limits/{res}",
                    "value": text(target),
                }
            )
            req = target - gap
            if req <= 0 or math.isclose(req, 0.0):
                req = target
            ops.append(
                {
                    "op": "add",
                    "path": f"/spec/containers/0/resources/requests/{res}",
                    "value": text(req),
                }
            )
        else:
            ops.append(
                {
                    "op": "add",
                    "path": f"/spec/containers/0/resources/requests/{res}",
                    "value": text(target),
                }
            )
    return ops
