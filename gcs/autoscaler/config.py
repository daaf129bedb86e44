"""Ray cluster-launcher YAML -> typed, validated scheduler config.

Follows Ray's ``AutoscalingConfig``: the head type's max gets +1, the cluster cap is
``max_workers + 1``, ``idle_timeout_minutes`` becomes seconds. Errors name the place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from gcs.autoscaler.scheduler.types import NodeTypeConfig, Options, SchedulerConfig


class ConfigError(ValueError):
    """A cluster config that cannot be used; the message names the offending place."""


@dataclass(frozen=True)
class ClusterConfig:
    scheduler: SchedulerConfig
    head_node_type: str
    upscaling_speed: float = 0.0


def _number(value: Any, where: str, *, minimum: float | None = 0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum:g}, got {value!r}")
    return float(value)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


def _node_type(name: str, raw: Any, is_head: bool) -> NodeTypeConfig:
    where = f"available_node_types.{name}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    resources = raw.get("resources", {})
    if not isinstance(resources, Mapping):
        raise ConfigError(f"{where}.resources: expected a mapping")
    res = {str(k): _number(v, f"{where}.resources.{k}") for k, v in resources.items()}
    min_w = _int(raw.get("min_workers", 0), f"{where}.min_workers")
    max_w = _int(raw.get("max_workers", 0), f"{where}.max_workers")
    if min_w > max_w:
        raise ConfigError(f"{where}: min_workers {min_w} > max_workers {max_w}")
    labels = raw.get("labels", {}) or {}
    if not isinstance(labels, Mapping):
        raise ConfigError(f"{where}.labels: expected a mapping")
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigError(f"{where}.priority: expected an integer, got {priority!r}")
    idle = raw.get("idle_timeout_s")
    return NodeTypeConfig(
        name=name,
        resources=res,
        min_workers=min_w,
        max_workers=max_w + (1 if is_head else 0),
        labels={str(k): str(v) for k, v in labels.items()},
        priority=priority,
        idle_timeout_s=None if idle is None else _number(idle, f"{where}.idle_timeout_s"),
        launch_config_hash=str(raw.get("launch_config_hash", "")),
    )


def parse_cluster_config(raw: Any, options: Options | None = None) -> ClusterConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("cluster config: expected a mapping at the top level")
    types_raw = raw.get("available_node_types")
    if not isinstance(types_raw, Mapping) or not types_raw:
        raise ConfigError("available_node_types: expected a non-empty mapping")
    if len(types_raw) == 1:
        head = next(iter(types_raw))
    else:
        head = raw.get("head_node_type")
        if head not in types_raw:
            raise ConfigError(f"head_node_type: {head!r} is not in available_node_types")
    types = {str(n): _node_type(str(n), t, n == head) for n, t in types_raw.items()}
    max_workers = raw.get("max_workers")
    cap = None if max_workers is None else _int(max_workers, "max_workers") + 1
    idle_min = raw.get("idle_timeout_minutes")
    idle = None if idle_min is None else _number(idle_min, "idle_timeout_minutes") * 60
    speed = _number(raw.get("upscaling_speed", 0.0), "upscaling_speed")
    sched = SchedulerConfig(
        node_types=types, max_num_nodes=cap, idle_timeout_s=idle, options=options or Options()
    )
    return ClusterConfig(scheduler=sched, head_node_type=str(head), upscaling_speed=speed)


def load_cluster_config(path: str | Path, options: Options | None = None) -> ClusterConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{at} malformed YAML") from exc
    try:
        return parse_cluster_config(raw, options)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def with_options(cfg: ClusterConfig, options: Options) -> ClusterConfig:
    return replace(cfg, scheduler=replace(cfg.scheduler, options=options))
