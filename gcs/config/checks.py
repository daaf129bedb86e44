"""Validation: every knob in range, storage URLs the registry knows, ``--ha`` only where
the store registry's row allows it, limits that fit a gRPC message.  Each error names the
key and its environment variable."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import fields
from typing import Any

from gcs.base.handler_delays import DelaySpecError, HandlerDelays
from gcs.config.errors import ConfigError
from gcs.config.keys import EVENT_LOOPS, LOG_LEVELS
from gcs.config.keys import names as _names
from gcs.config.schema import GcsConfig, RequestLimits

__all__ = [
    "HA_MIN_RENEW_MS",
    "HA_TTL_RANGE_MS",
    "REQUEST_OVERHEAD_BYTES",
    "STORAGE_FORMS",
    "check_ha",
    "check_limits",
    "kv_put_request_bytes",
    "storage_scheme_ok",
    "storage_url_problem",
    "validate",
]


HA_TTL_RANGE_MS = (200, 60_000)
"""Allowed ``ha.lease_ttl_ms``: shorter leases lapse on a slow store round trip; longer ones
make a takeover wait that long."""
HA_MIN_RENEW_MS = 50


_POSITIVE = (
    "health.max_concurrent",
    "load_poll.timeout_ms",
    "load_poll.max_concurrent",
    "raylet_rpc_timeout_ms",
    "load_poll.failure_backoff_max_ms",
    "grpc_max_message_bytes",
    "front_max_concurrent_streams",
    "front_max_buffered_bytes",
    "front_buffer_budget_bytes",
    "http2.reset_burst",
    "http2.reset_rate",
    "http2.glitch_burst",
    "http2.glitch_rate",
    "http2.settings_burst",
    "http2.settings_rate",
    "http2.max_settings_entries",
    "http2.max_header_list_bytes",
    "http2.max_outbound_acks",
    "redis.wait_timeout_ms",
)
"""Our own periods, timeouts and limits that must be > 0 (a zero period would spin a core)."""
_NON_NEGATIVE = (
    # Ray's knobs: Ray's GCS refuses negatives here (RAY_CHECK_GE in its health-check
    # manager) or reads them unsigned; 0 is "now" / "off" / "none kept".
    "health.initial_delay_ms",
    "health.period_ms",
    "health.timeout_ms",
    "health.failure_threshold",
    "load_poll.period_ms",
    "node_instances_replenish_interval_ms",
    "expired_job_clusters_gc_interval_ms",
    "max_dead_nodes_cached",
    "load_poll.syncer_max_staleness_ms",
    "max_dead_workers_cached",
    "max_dead_actors_cached",
    "gc_gen0_threshold",
    "mark_task_failed_on_worker_dead_delay_ms",
    "mark_task_failed_on_job_done_delay_ms",
    "http2.max_continuations",
    "http2.min_ping_interval_ms",
    "http2.max_ping_strikes",
)


_PYTHON_VERSION = re.compile(r"\d+\.\d+\.\d+")


def _get_path(config: Any, path: str) -> Any:
    value = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def storage_scheme_ok(url: str) -> bool:
    """A scheme the store registry (``gcs.store.registry.STORES``) has a backend for."""
    from gcs.store.registry import STORES

    return STORES.kind_of(url) is not None


STORAGE_FORMS = (
    "memory://, sqlite:///relative/path.db, sqlite:////absolute/path.db, "
    "postgresql+asyncpg://USER@HOST/DB or redis://HOST:PORT/DB"
)


def storage_url_problem(url: str) -> str | None:
    """What is wrong with a storage URL as typed (None: nothing we can see before opening
    it).  SQLite's URL has no host: ``sqlite://relative.db`` reads "relative.db" as one, so
    the path needs a third slash (a fourth for an absolute path)."""
    from gcs.store.registry import scheme_of

    if not storage_scheme_ok(url):
        return f"{url!r}: unsupported scheme; use {STORAGE_FORMS}"
    if scheme_of(url) == "sqlite":
        scheme, _, rest = url.partition("://")
        if rest and not rest.startswith("/"):
            return (
                f"{url!r}: a SQLite URL has no host; write {scheme}:///{rest} (a path "
                f"relative to the current directory) or {scheme}:////ABSOLUTE/PATH"
            )
    return None


def validate(config: GcsConfig, where: str = "config") -> None:
    """Every knob in range; each error names the key (and its environment variable)."""
    if config.log_format not in {"json", "console", "auto"}:
        raise ConfigError(f"{where}.{_names('log_format')}: must be json, console or auto")
    if config.log_level.lower() not in LOG_LEVELS:
        raise ConfigError(
            f"{where}.{_names('log_level')}: {config.log_level!r} is not one of "
            + ", ".join(LOG_LEVELS)
        )
    if config.event_loop not in EVENT_LOOPS:
        raise ConfigError(
            f"{where}.{_names('event_loop')}: {config.event_loop!r} is not one of "
            + ", ".join(EVENT_LOOPS)
        )
    if not 0 <= config.port <= 65535:
        raise ConfigError(f"{where}.{_names('port')}: must be in 0..65535, got {config.port}")
    if not -1 <= config.metrics_port <= 65535:
        raise ConfigError(
            f"{where}.{_names('metrics_port')}: must be -1 (off), 0 (any) or a port, "
            f"got {config.metrics_port}"
        )
    if not -1 <= config.metrics_agent_port <= 65535:
        raise ConfigError(
            f"{where}.{_names('metrics_agent_port')}: must be -1 (off), 0 (the head node's "
            "agent) or a port, "
            f"got {config.metrics_agent_port}"
        )
    if config.load_poll.transport not in {"grpc", "h2"}:
        raise ConfigError(f"{where}.{_names('load_poll.transport')}: must be grpc or h2")
    storage_problem = storage_url_problem(config.storage) if config.storage else None
    if storage_problem:
        raise ConfigError(f"{where}.{_names('storage')}: {storage_problem}")
    for path in _POSITIVE:
        value = _get_path(config, path)
        if value <= 0:
            raise ConfigError(f"{where}.{_names(path)}: must be > 0, got {value}")
    for path in _NON_NEGATIVE:
        value = _get_path(config, path)
        if value < 0:
            raise ConfigError(f"{where}.{_names(path)}: must be >= 0, got {value}")
    if config.python_version and not _PYTHON_VERSION.fullmatch(config.python_version):
        raise ConfigError(
            f"{where}.{_names('python_version')}: expected MAJOR.MINOR.PATCH such as 3.11.7, "
            f"got {config.python_version!r}"
        )
    if not config.temp_dir.startswith("/"):
        raise ConfigError(
            f"{where}.{_names('temp_dir')}: must be an absolute path, got {config.temp_dir!r}"
        )
    for name in ("dashboard", "head_raylet"):
        if getattr(config, name) and not config.head:
            raise ConfigError(f"{where}.{_names(name)}: needs {_names('head')}")
    if not 1 <= config.dashboard_port <= 65535:
        raise ConfigError(
            f"{where}.{_names('dashboard_port')}: must be in 1..65535, got {config.dashboard_port}"
        )
    if config.ray_python and not config.ray_python.startswith("/"):
        raise ConfigError(
            f"{where}.{_names('ray_python')}: must be an absolute path, got {config.ray_python!r}"
        )
    try:
        shlex.split(config.head_raylet_args)
    except ValueError as err:
        raise ConfigError(f"{where}.{_names('head_raylet_args')}: {err}") from None
    if config.redis.wait_replicas < -1:
        raise ConfigError(
            f"{where}.{_names('redis.wait_replicas')}: must be -1 (one whenever the master has "
            f"a replica), 0 (off) or a count, got {config.redis.wait_replicas}"
        )
    if config.redis.username and not config.redis.password:
        raise ConfigError(f"{where}.{_names('redis.username')}: needs a password")
    try:
        HandlerDelays.parse(config.testing_asio_delay_us)
    except DelaySpecError as err:
        raise ConfigError(f"{where}.{_names('testing_asio_delay_us')}: {err}") from None
    if config.ray_internal_config:
        try:
            internal = json.loads(config.ray_internal_config)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}.ray_internal_config: not JSON ({err.msg})") from None
        if not isinstance(internal, dict):
            raise ConfigError(f"{where}.ray_internal_config: must be a JSON object")
    if config.load_poll.slice_size < 1:
        raise ConfigError(f"{where}.load_poll.slice_size: must be >= 1")
    if not 0 <= config.load_poll.spread <= 1:
        raise ConfigError(f"{where}.load_poll.spread: must be in [0, 1]")
    check_limits(config, where)
    check_ha(config, where)
    io = config.raylet_io
    for name in ("max_open_clients", "max_in_flight", "max_calls_per_s"):
        if getattr(io, name) < 0:
            raise ConfigError(f"{where}.raylet_io.{name}: must be >= 0 (0 = automatic)")
    if io.startup_contacts_per_s <= 0:
        raise ConfigError(f"{where}.raylet_io.startup_contacts_per_s: must be > 0")


def check_ha(config: GcsConfig, where: str = "config") -> None:
    """``ha.*`` in range, and ``--ha`` only on a store other processes can reach."""
    ha = config.ha
    low, high = HA_TTL_RANGE_MS
    if not low <= ha.lease_ttl_ms <= high:
        raise ConfigError(
            f"{where}.{_names('ha.lease_ttl_ms')}: must be in {low}..{high}, got {ha.lease_ttl_ms}"
        )
    if not HA_MIN_RENEW_MS <= ha.renew_interval_ms <= ha.lease_ttl_ms // 2:
        raise ConfigError(
            f"{where}.{_names('ha.renew_interval_ms')}: must be in {HA_MIN_RENEW_MS}.."
            f"{ha.lease_ttl_ms // 2} (at most half of ha.lease_ttl_ms), got {ha.renew_interval_ms}"
        )
    if not -1 <= ha.status_port <= 65535:
        raise ConfigError(
            f"{where}.{_names('ha.status_port')}: must be -1 (none), 0 (any) or a port, "
            f"got {ha.status_port}"
        )
    if not ha.enabled:
        return
    from gcs.store.registry import STORES, scheme_of

    kind = STORES.kind_of(config.storage_url())
    if kind is None or not kind.ha:  # the row says whether other GCS processes share it
        scheme = scheme_of(config.storage_url())
        raise ConfigError(
            f"{where}.{_names('ha.enabled')}: --ha needs a store other GCS processes share "
            f"(redis://... or postgresql+asyncpg://...), not {scheme or 'the embedded'} storage"
        )


REQUEST_OVERHEAD_BYTES = 64 * 1024


def check_limits(config: GcsConfig, where: str = "config") -> None:
    """Every limit positive; a KV put at the limits must fit in one gRPC message."""
    for f in fields(RequestLimits):
        if getattr(config.limits, f.name) <= 0:
            raise ConfigError(f"{where}.limits.{f.name}: must be > 0")
    lim = config.limits
    needed = kv_put_request_bytes(lim)
    if needed > config.grpc_max_message_bytes:
        raise ConfigError(
            f"{where}.limits.max_kv_value_bytes: {lim.max_kv_value_bytes} plus a key does not "
            f"fit in grpc_max_message_bytes ({config.grpc_max_message_bytes})"
        )


def kv_put_request_bytes(limits: RequestLimits) -> int:
    """The largest ``InternalKVPut`` request: a value and a key at their limits."""
    return limits.max_kv_value_bytes + limits.max_kv_key_bytes + REQUEST_OVERHEAD_BYTES
