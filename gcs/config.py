"""Server configuration: frozen dataclasses, units in names, Ray's defaults.

Precedence: CLI flag > environment (``GCS_*``; Ray's ``RAY_<name>`` where Ray has the knob)
> config file (YAML) > default.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import yaml


@dataclass(frozen=True, slots=True)
class HealthCheckConfig:
    """GCS -> raylet gRPC health checks (Ray: ``health_check_*``)."""

    initial_delay_ms: int = 5000
    period_ms: int = 3000
    timeout_ms: int = 10000
    failure_threshold: int = 5
    max_concurrent: int = 512
    """Health RPCs in flight at once (Ray has no cap; we bound it for 2,000+ nodes)."""


@dataclass(frozen=True, slots=True)
class LoadPollConfig:
    """``NodeManagerService.GetResourceLoad`` polling (Ray: gcs_pull_resource_loads_period)."""

    period_ms: int = 1000
    timeout_ms: int = 2000
    """Per-call deadline; a slow raylet only delays its own entry."""
    max_concurrent: int = 1024
    slice_size: int = 64
    """Polls started, and replies applied, per event-loop turn: a round of 2,000 never holds
    the loop (and the requests it serves) in one iteration."""
    spread: float = 0.5
    """Fraction of the period over which a round's slices are started (0: back to back);
    each node is still polled once per period, but replies no longer arrive in one burst."""
    transport: str = "h2"
    """``h2``: the lean HTTP/2 client of ``gcs.managers.h2_unary`` (~3x less GCS CPU per poll;
    a raylet it cannot talk to falls back to grpc), or ``grpc`` (grpc.aio for every call)."""


@dataclass(frozen=True, slots=True)
class GcsConfig:
    host: str = "127.0.0.1"
    port: int = 6379
    storage: str = ""
    """Store URL; empty = embedded SQLite under ``data_dir``."""
    namespace: str = "default"
    """Key namespace per cluster in a shared backend (Ray: external_storage_namespace)."""
    data_dir: str = ".gcs-data"
    metrics_port: int = 0
    """Prometheus HTTP port; 0 = pick a free one, -1 = disabled."""
    log_format: str = "auto"
    """``json``, ``console`` or ``auto`` (console on a TTY)."""
    log_level: str = "info"
    session_name: str = ""
    """Empty = ``session_<timestamp>_<pid>`` generated on first start and persisted."""
    health: HealthCheckConfig = field(default_factory=HealthCheckConfig)
    load_poll: LoadPollConfig = field(default_factory=LoadPollConfig)
    max_dead_nodes_cached: int = 1000
    raylet_rpc_timeout_ms: int = 30000
    """Deadline for forwarded raylet calls (DrainRaylet, Resize)."""
    max_map_entries: int = 10000
    """Largest resources/labels map accepted in a request."""
    grpc_max_message_bytes: int = 512 * 1024 * 1024
    gc_gen0_threshold: int = 20_000
    """Python's cyclic-GC gen-0 threshold (default 700; 0 leaves Python's GC settings alone).
    A collection's pause grows with this (under a 2,000-raylet poll: gen-0 ~5-20 ms, the
    gen-1 that follows every second one ~20-25 ms at 20,000; 50,000 gave 30 and 75 ms), and
    Python's default collects so often that old generations showed up as latency spikes."""
    gc_gen1_threshold: int = 1
    """A gen-1 collection follows every (this + 1)-th gen-0 one (Python: 10): with
    ``gc_freeze_survivors`` it scans at most two batches of survivors, then freezes them."""
    gc_freeze_survivors: bool = True
    """Freeze what survives a gen-1 collection (``gc.freeze``), so no automatic collection
    scans the long-lived heap (at 2,000 nodes a full collection costs 130-300 ms); one full
    collection reclaims cycles among frozen objects each time resident memory doubles past
    512 MB (``gcs.server.gc_policy``)."""
    node_instances_replenish_interval_ms: int = 30000
    """Period of virtual-cluster dead-node replenishment (ant-ray's name and default)."""
    expired_job_clusters_gc_interval_ms: int = 30000
    """Period of the GC of finished, idle job clusters (ant-ray's name and default)."""

    def storage_url(self) -> str:
        if self.storage:
            return self.storage
        path = pathlib.Path(self.data_dir).resolve() / "gcs.sqlite3"
        return f"sqlite+aiosqlite:///{path}"


# env var -> dotted field path.  Ray's names first where Ray has the knob.
ENV_VARS: dict[str, str] = {
    "GCS_HOST": "host",
    "GCS_PORT": "port",
    "GCS_STORAGE": "storage",
    "GCS_NAMESPACE": "namespace",
    "RAY_external_storage_namespace": "namespace",
    "GCS_DATA_DIR": "data_dir",
    "GCS_METRICS_PORT": "metrics_port",
    "GCS_LOG_FORMAT": "log_format",
    "GCS_LOG_LEVEL": "log_level",
    "RAY_health_check_initial_delay_ms": "health.initial_delay_ms",
    "RAY_health_check_period_ms": "health.period_ms",
    "RAY_health_check_timeout_ms": "health.timeout_ms",
    "RAY_health_check_failure_threshold": "health.failure_threshold",
    "RAY_gcs_pull_resource_loads_period_milliseconds": "load_poll.period_ms",
    "GCS_LOAD_POLL_TRANSPORT": "load_poll.transport",
    "GCS_LOAD_POLL_SLICE_SIZE": "load_poll.slice_size",
    "GCS_LOAD_POLL_SPREAD": "load_poll.spread",
    "RAY_maximum_gcs_dead_node_cached_count": "max_dead_nodes_cached",
    "RAY_node_instances_replenish_interval_ms": "node_instances_replenish_interval_ms",
    "RAY_expired_job_clusters_gc_interval_ms": "expired_job_clusters_gc_interval_ms",
}


class ConfigError(ValueError):
    """A config value is malformed; the message names the source and the key."""


def _coerce(value: Any, target: Any, where: str) -> Any:
    if target is int:
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if target is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if target is str:
        return str(value)
    return value


def _set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    node = tree
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    kwargs = {}
    for name, value in data.items():
        f = known[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}.{name}: expected a mapping")
            kwargs[name] = _build(type(default), value, f"{where}.{name}")
        else:
            target = type(f.default) if f.default is not dataclasses.MISSING else str
            kwargs[name] = _coerce(value, target, f"{where}.{name}")
    return cls(**kwargs)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(
    *,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> GcsConfig:
    """Merge default < file < environment < flags (flags given as dotted paths)."""
    tree: dict[str, Any] = {}
    if config_file:
        try:
            loaded = yaml.safe_load(pathlib.Path(config_file).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from exc
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"config file {config_file}: top level must be a mapping")
        tree = _merge(tree, loaded)
    env = os.environ if env is None else env
    env_tree: dict[str, Any] = {}
    for var, path in ENV_VARS.items():
        if var in env and env[var] != "":
            _set_path(env_tree, path, env[var])
    tree = _merge(tree, env_tree)
    flag_tree: dict[str, Any] = {}
    for path, value in (flags or {}).items():
        if value is not None:
            _set_path(flag_tree, path, value)
    tree = _merge(tree, flag_tree)
    where = f"config ({config_file})" if config_file else "config"
    config = _build(GcsConfig, tree, where)
    if config.log_format not in {"json", "console", "auto"}:
        raise ConfigError(f"{where}.log_format: must be json, console or auto")
    if not 0 <= config.port <= 65535:
        raise ConfigError(f"{where}.port: out of range: {config.port}")
    if config.load_poll.slice_size < 1:
        raise ConfigError(f"{where}.load_poll.slice_size: must be >= 1")
    if not 0 <= config.load_poll.spread <= 1:
        raise ConfigError(f"{where}.load_poll.spread: must be in [0, 1]")
    if config.load_poll.transport not in {"grpc", "h2"}:
        raise ConfigError(f"{where}.load_poll.transport: must be grpc or h2")
    return config
