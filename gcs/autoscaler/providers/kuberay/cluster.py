"""RayCluster custom resource -> autoscaling config, as Ray's KubeRay config reader does.

Node types are the groups (``headgroup`` and each ``groupName``); resources come from
``rayStartParams`` (``num-cpus``, ``num-gpus``, ``memory``, ``resources``) else the Ray
container's limits (else requests); ``minReplicas``/``maxReplicas`` times ``numOfHosts`` are
the worker bounds; ``autoscalerOptions.upscalingMode`` (Conservative = 1, else 1000) and
``idleTimeoutSeconds`` (default 60) as in Ray.  IPPR groups carry their ``ray.io/ippr``
entry.  A group whose IPPR entry is misconfigured is frozen: its max is what runs now, so it
neither scales out nor is capped down.

Scale-down limits beyond Ray come from the RayCluster's annotations (the cluster YAML's
``disruption:``): ``gcs.ray.io/disruption-budget`` ("2" nodes or "20%" of the workers
leaving at once) and ``gcs.ray.io/do-not-disrupt-label`` (Ray nodes with that label "true"
are never removed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gcs.autoscaler.config import ClusterConfig, ConfigError, parse_cluster_config, quantity
from gcs.autoscaler.providers.kuberay.ippr import HEAD_GROUP, IpprConfig, group_specs
from gcs.policy.autoscaling.scheduler.types import Options

DEFAULT_IDLE_TIMEOUT_S = 60.0
DISRUPTION_BUDGET_ANNOTATION = "gcs.ray.io/disruption-budget"
DO_NOT_DISRUPT_LABEL_ANNOTATION = "gcs.ray.io/do-not-disrupt-label"
_UPSCALING_SPEED = {"Conservative": 1.0, "Default": 1000.0, "Aggressive": 1000.0}


def _params_number(params: Mapping[str, Any], key: str, where: str) -> float | None:
    if key not in params:
        return None
    try:
        return float(str(params[key]).strip().strip('"'))
    except ValueError:
        raise ConfigError(f"{where}.rayStartParams.{key}: not a number ({params[key]!r})") from None


def group_resources(name: str, group: Mapping[str, Any]) -> dict[str, float]:
    where = name
    params = group.get("rayStartParams") or {}
    containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    res = containers[0].get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    out: dict[str, float] = {}
    cpu = _params_number(params, "num-cpus", where)
    if cpu is None and ("cpu" in limits or "cpu" in requests):
        cpu = float(math.ceil(quantity(limits.get("cpu", requests.get("cpu")), f"{where}.cpu")))
    if cpu is not None:
        out["CPU"] = cpu
    mem = _params_number(params, "memory", where)
    if mem is None and ("memory" in limits or "memory" in requests):
        mem = quantity(limits.get("memory", requests.get("memory")), f"{where}.memory")
    if mem is not None:
        out["memory"] = float(int(mem))
    gpu = _params_number(params, "num-gpus", where)
    if gpu is None:
        for key, value in limits.items():
            if key.endswith("/gpu"):
                gpu = quantity(value, f"{where}.{key}")
    if gpu:
        out["GPU"] = gpu
    custom = params.get("resources")
    if custom:
        try:
            extra = json.loads(str(custom).strip().strip("'").replace('\\"', '"').strip('"'))
        except ValueError:
            raise ConfigError(f"{where}.rayStartParams.resources: not a JSON object") from None
        if not isinstance(extra, dict):
            raise ConfigError(f"{where}.rayStartParams.resources: not a JSON object")
        out.update({str(k): float(v) for k, v in extra.items()})
    return out


def cluster_config(
    cr: Mapping[str, Any],
    ippr: IpprConfig,
    running_per_group: Mapping[str, int],
    options: Options | None = None,
) -> ClusterConfig:
    """The scheduler's config for this RayCluster (re-read every round, as Ray does)."""
    meta, spec = cr.get("metadata") or {}, cr.get("spec") or {}
    auto = spec.get("autoscalerOptions") or {}
    idle = auto.get("idleTimeoutSeconds", DEFAULT_IDLE_TIMEOUT_S)
    mode = str(auto.get("upscalingMode") or "Default")
    types: dict[str, Any] = {}
    total_max = 0
    for name, group in group_specs(cr).items():
        node: dict[str, Any] = {"resources": group_resources(name, group)}
        if name == HEAD_GROUP:
            node.update(min_workers=0, max_workers=0)
        else:
            hosts = int(group.get("numOfHosts") or 1)
            lo = int(group.get("minReplicas") or 0) * hosts
            hi = int(group.get("maxReplicas", group.get("replicas", 0)) or 0) * hosts
            if name in ippr.errors:  # frozen: no scale-out, nothing capped away either
                running = running_per_group.get(name, 0)
                lo, hi = min(lo, running), running
            node.update(min_workers=min(lo, hi), max_workers=hi)
            total_max += hi
            if group.get("idleTimeoutSeconds") is not None:
                node["idle_timeout_s"] = float(group["idleTimeoutSeconds"])
            entry = ippr.groups.get(name)
            if entry is not None:
                node["ippr"] = {
                    "max-cpu": entry.spec.max_cpu,
                    "max-memory": entry.spec.max_memory,
                    "resize-timeout": entry.spec.resize_timeout_s,
                }
        types[name] = node
    raw: dict[str, Any] = {
        "cluster_name": str(meta.get("name", "default")),
        "max_workers": total_max,
        "upscaling_speed": _UPSCALING_SPEED.get(mode, 1000.0),
        "idle_timeout_minutes": float(idle) / 60.0,
        "provider": {
            "type": "kuberay",
            "namespace": meta.get("namespace", "default"),
            "cluster_name": meta.get("name", ""),
        },
        "head_node_type": HEAD_GROUP,
        "available_node_types": types,
    }
    disruption = _disruption_annotations(meta.get("annotations") or {})
    if disruption:
        raw["disruption"] = disruption
    try:
        cfg = parse_cluster_config(raw, options)
    except ConfigError as err:  # name the annotation, not the YAML key it maps to
        text = str(err).replace("disruption.budget", DISRUPTION_BUDGET_ANNOTATION)
        raise ConfigError(
            text.replace("disruption.do_not_disrupt_label", DO_NOT_DISRUPT_LABEL_ANNOTATION)
        ) from None
    # the IPPR minimum is the pod template's size (limit else request), not the logical one
    node_types = dict(cfg.scheduler.node_types)
    for name, entry in ippr.groups.items():
        t = node_types.get(name)
        if t is not None and t.ippr is not None:
            node_types[name] = replace(t, ippr=entry.spec)
    return replace(cfg, scheduler=replace(cfg.scheduler, node_types=node_types))


def _disruption_annotations(annotations: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if DISRUPTION_BUDGET_ANNOTATION in annotations:
        out["budget"] = str(annotations[DISRUPTION_BUDGET_ANNOTATION])
    if DO_NOT_DISRUPT_LABEL_ANNOTATION in annotations:
        out["do_not_disrupt_label"] = str(annotations[DO_NOT_DISRUPT_LABEL_ANNOTATION])
    return out
