"""The simulator's workload file: task arrivals and how the simulated cloud behaves.

    duration: 24h            # total simulated time (s, m, h suffixes or seconds)
    interval_s: 5            # reconcile interval (Ray's AUTOSCALER_UPDATE_INTERVAL_S)
    cloud:
      launch_delay_s: 60     # request -> cloud instance exists
      boot_delay_s: 30       # instance exists -> its Ray node registers
      failure_rate: 0.0      # fraction of launched instances that fail
      capacity: {gpu: 8}     # most instances of a node type at once
      seed: 1
    tasks:
      - at: 0                # first arrival
        count: 100           # tasks per arrival
        resources: {CPU: 1}
        duration: 10m
        every: 1h            # optional: repeat ...
        until: 12h           # ... up to this time

Every error names the field (``tasks[2].resources.CPU: ...``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class WorkloadError(ValueError):
    """The workload file cannot be used; the message names the field."""


@dataclass(frozen=True)
class CloudBehaviour:
    launch_delay_s: float = 60.0
    boot_delay_s: float = 30.0
    failure_rate: float = 0.0
    capacity: Mapping[str, int] = field(default_factory=dict)
    seed: int = 1


@dataclass(frozen=True)
class TaskBatch:
    at_s: float
    count: int
    resources: Mapping[str, float]
    duration_s: float


@dataclass(frozen=True)
class Workload:
    duration_s: float
    interval_s: float
    cloud: CloudBehaviour
    batches: tuple[TaskBatch, ...]


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        out = float(value)
    elif isinstance(value, str):
        parts = re.fullmatch(r"\s*((?:\d+(?:\.\d+)?[smhd]\s*)+)\s*", value)
        if not parts:
            raise WorkloadError(
                f"{where}: expected a duration like 90, 30m or 1h30m, got {value!r}"
            )
        out = sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smhd])", value))
    else:
        raise WorkloadError(f"{where}: expected a duration, got {value!r}")
    if not math.isfinite(out) or out < 0:
        raise WorkloadError(f"{where}: must be a finite, non-negative duration")
    return out


def _number(value: Any, where: str, *, lo: float = 0.0, hi: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WorkloadError(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(value) or not lo <= value <= hi:
        raise WorkloadError(f"{where}: must be between {lo:g} and {hi:g}, got {value!r}")
    return float(value)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WorkloadError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


def _keys(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(map(str, raw)) - allowed)
    if extra:
        raise WorkloadError(f"{where + '.' if where else ''}{extra[0]}: unknown key")


def parse_workload(raw: Any) -> Workload:
    if not isinstance(raw, Mapping):
        raise WorkloadError("workload: expected a mapping at the top level")
    _keys(raw, {"duration", "interval_s", "cloud", "tasks"}, "")
    duration = seconds(raw.get("duration", "1h"), "duration")
    interval = _number(raw.get("interval_s", 5.0), "interval_s", lo=0.1, hi=3600)
    cloud_raw = raw.get("cloud", {}) or {}
    if not isinstance(cloud_raw, Mapping):
        raise WorkloadError("cloud: expected a mapping")
    _keys(
        cloud_raw,
        {"launch_delay_s", "boot_delay_s", "failure_rate", "capacity", "seed"},
        "cloud",
    )
    cap_raw = cloud_raw.get("capacity", {}) or {}
    if not isinstance(cap_raw, Mapping):
        raise WorkloadError("cloud.capacity: expected a mapping of node type to a count")
    cloud = CloudBehaviour(
        launch_delay_s=seconds(cloud_raw.get("launch_delay_s", 60), "cloud.launch_delay_s"),
        boot_delay_s=seconds(cloud_raw.get("boot_delay_s", 30), "cloud.boot_delay_s"),
        failure_rate=_number(cloud_raw.get("failure_rate", 0.0), "cloud.failure_rate", hi=1.0),
        capacity={str(k): _count(v, f"cloud.capacity.{k}") for k, v in cap_raw.items()},
        seed=_count(cloud_raw.get("seed", 1), "cloud.seed"),
    )
    tasks_raw = raw.get("tasks", [])
    if not isinstance(tasks_raw, list):
        raise WorkloadError("tasks: expected a list")
    batches: list[TaskBatch] = []
    for i, t in enumerate(tasks_raw):
        where = f"tasks[{i}]"
        if not isinstance(t, Mapping):
            raise WorkloadError(f"{where}: expected a mapping")
        _keys(t, {"at", "count", "resources", "duration", "every", "until"}, where)
        res = t.get("resources")
        if not isinstance(res, Mapping) or not res:
            raise WorkloadError(f"{where}.resources: expected a non-empty mapping")
        resources = {str(k): _number(v, f"{where}.resources.{k}") for k, v in res.items()}
        at = seconds(t.get("at", 0), f"{where}.at")
        count = _count(t.get("count", 1), f"{where}.count")
        dur = seconds(t.get("duration", 60), f"{where}.duration")
        every = t.get("every")
        until = seconds(t.get("until", duration), f"{where}.until")
        if every is None:
            batches.append(TaskBatch(at, count, resources, dur))
            continue
        step = seconds(every, f"{where}.every")
        if step <= 0:
            raise WorkloadError(f"{where}.every: must be > 0")
        n = 0
        while at + n * step <= min(until, duration):
            batches.append(TaskBatch(at + n * step, count, resources, dur))
            n += 1
            if len(batches) > 1_000_000:
                raise WorkloadError(f"{where}: more than a million arrivals")
    batches.sort(key=lambda b: b.at_s)
    return Workload(duration, interval, cloud, tuple(batches))


def yaml_error_at(exc: yaml.YAMLError) -> str:
    """`` line L column C`` of a YAML parse error (as ``--config`` errors say), or ""."""
    mark = getattr(exc, "problem_mark", None)
    return f" line {mark.line + 1} column {mark.column + 1}" if mark else ""


def load_workload(path: str | Path) -> Workload:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise WorkloadError(f"{path}:{yaml_error_at(exc)} malformed YAML") from exc
    try:
        return parse_workload(raw)
    except WorkloadError as exc:
        raise WorkloadError(f"{path}: {exc}") from exc
