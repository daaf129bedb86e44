"""Where each knob can be given besides the file's nesting: environment variables (ours,
``GCS_*``; Ray's, ``RAY_<name>``), Ray's flat knob names in a file, and how Ray reads its
unsigned knobs."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from gcs.config.schema import Http2Limits, RequestLimits

__all__ = [
    "DEFAULT_METRICS_PORT",
    "ENV_VARS",
    "EVENT_LOOPS",
    "LOG_LEVELS",
    "RAY_FILE_KEYS",
    "RAY_UNSIGNED_BITS",
    "TOKEN_ENV_VARS",
    "names",
    "ray_knob_value",
]


DEFAULT_METRICS_PORT = 9379
"""Where ``gcs serve`` exports Prometheus metrics unless told otherwise."""

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
EVENT_LOOPS = ("asyncio", "uvloop")

# env var -> dotted field path.  Ray's names first where Ray has the knob.
ENV_VARS: dict[str, str] = {
    "GCS_HOST": "host",
    "GCS_NODE_IP_ADDRESS": "node_ip_address",
    "GCS_PORT": "port",
    "GCS_STORAGE": "storage",
    "GCS_NAMESPACE": "namespace",
    "RAY_external_storage_namespace": "namespace",
    "RAY_redis_db_connect_retries": "redis_db_connect_retries",
    "RAY_redis_db_connect_wait_milliseconds": "redis_db_connect_wait_milliseconds",
    "GCS_DATA_DIR": "data_dir",
    "GCS_METRICS_PORT": "metrics_port",
    "GCS_LOG_FORMAT": "log_format",
    "GCS_LOG_LEVEL": "log_level",
    "GCS_EVENT_LOOP": "event_loop",
    "GCS_PYTHON_VERSION": "python_version",
    "GCS_HEAD": "head",
    "GCS_TEMP_DIR": "temp_dir",
    "GCS_DASHBOARD": "dashboard",
    "GCS_DASHBOARD_HOST": "dashboard_host",
    "GCS_DASHBOARD_PORT": "dashboard_port",
    "GCS_HEAD_RAYLET": "head_raylet",
    "GCS_HEAD_RAYLET_ARGS": "head_raylet_args",
    "GCS_RAY_PYTHON": "ray_python",
    "RAY_health_check_initial_delay_ms": "health.initial_delay_ms",
    "RAY_health_check_period_ms": "health.period_ms",
    "RAY_health_check_timeout_ms": "health.timeout_ms",
    "RAY_health_check_failure_threshold": "health.failure_threshold",
    "RAY_gcs_pull_resource_loads_period_milliseconds": "load_poll.period_ms",
    "GCS_LOAD_POLL_TRANSPORT": "load_poll.transport",
    "GCS_RAYLET_MAX_OPEN_CLIENTS": "raylet_io.max_open_clients",
    "GCS_RAYLET_MAX_IN_FLIGHT": "raylet_io.max_in_flight",
    "GCS_RAYLET_MAX_CALLS_PER_S": "raylet_io.max_calls_per_s",
    "GCS_RAYLET_STARTUP_CONTACTS_PER_S": "raylet_io.startup_contacts_per_s",
    "GCS_LOAD_POLL_SLICE_SIZE": "load_poll.slice_size",
    "GCS_LOAD_POLL_SPREAD": "load_poll.spread",
    "GCS_LOAD_POLL_SYNCER_MAX_STALENESS_MS": "load_poll.syncer_max_staleness_ms",
    "RAY_maximum_gcs_dead_node_cached_count": "max_dead_nodes_cached",
    "GCS_MAX_DEAD_WORKERS_CACHED": "max_dead_workers_cached",
    "RAY_maximum_gcs_dead_worker_cached_count": "max_dead_workers_cached",
    "RAY_task_events_max_num_task_in_gcs": "task_events_max_num_task_in_gcs",
    "RAY_task_events_max_num_profile_events_per_task": (
        "task_events_max_num_profile_events_per_task"
    ),
    "RAY_maximum_gcs_destroyed_actor_cached_count": "max_dead_actors_cached",
    "RAY_gcs_mark_task_failed_on_worker_dead_delay_ms": (
        "mark_task_failed_on_worker_dead_delay_ms"
    ),
    "RAY_gcs_mark_task_failed_on_job_done_delay_ms": "mark_task_failed_on_job_done_delay_ms",
    "RAY_node_instances_replenish_interval_ms": "node_instances_replenish_interval_ms",
    "RAY_expired_job_clusters_gc_interval_ms": "expired_job_clusters_gc_interval_ms",
    "RAY_AUTH_MODE": "auth_mode",
    "RAY_testing_asio_delay_us": "testing_asio_delay_us",
    "RAY_event_stats": "event_stats",
    "RAY_event_stats_print_interval_ms": "event_stats_print_interval_ms",
    "RAY_metrics_report_interval_ms": "metrics_report_interval_ms",
    "GCS_METRICS_AGENT_PORT": "metrics_agent_port",
    "RAY_enable_metrics_collection": "enable_metrics_collection",
    "GCS_FRONT_SERVER": "front_server",
    "GCS_REDIS_USERNAME": "redis.username",
    "GCS_REDIS_PASSWORD": "redis.password",
    "GCS_REDIS_WAIT_REPLICAS": "redis.wait_replicas",
    "GCS_REDIS_WAIT_TIMEOUT_MS": "redis.wait_timeout_ms",
    "GCS_HA": "ha.enabled",
    "GCS_HA_LEASE_TTL_MS": "ha.lease_ttl_ms",
    "GCS_HA_RENEW_INTERVAL_MS": "ha.renew_interval_ms",
    "GCS_HA_HOLDER": "ha.holder",
    "GCS_HA_STATUS_PORT": "ha.status_port",
    "GCS_HA_LOCK_DIR": "ha.lock_dir",
    "GCS_FRONT_MAX_CONCURRENT_STREAMS": "front_max_concurrent_streams",
    "GCS_FRONT_MAX_BUFFERED_BYTES": "front_max_buffered_bytes",
    "GCS_FRONT_BUFFER_BUDGET_BYTES": "front_buffer_budget_bytes",
    **{f"GCS_HTTP2_{f.name.upper()}": f"http2.{f.name}" for f in fields(Http2Limits)},
    **{f"GCS_{f.name.upper()}": f"limits.{f.name}" for f in fields(RequestLimits)},
}
TOKEN_ENV_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""Ray's token sources: they override a config file's ``auth_token_path`` (not the flag)."""


RAY_FILE_KEYS: dict[str, str] = {
    var.removeprefix("RAY_"): path for var, path in ENV_VARS.items() if var.startswith("RAY_")
}
"""Ray's knob names accepted as top-level keys of a ``--config`` file too
(``health_check_period_ms: 1000`` = ``health: {period_ms: 1000}``)."""

RAY_UNSIGNED_BITS: dict[str, int] = {
    "gcs_pull_resource_loads_period_milliseconds": 64,
    "maximum_gcs_dead_node_cached_count": 32,
    "maximum_gcs_destroyed_actor_cached_count": 32,
    "maximum_gcs_dead_worker_cached_count": 32,
    "gcs_mark_task_failed_on_worker_dead_delay_ms": 64,
    "gcs_mark_task_failed_on_job_done_delay_ms": 64,
    "node_instances_replenish_interval_ms": 64,
    "expired_job_clusters_gc_interval_ms": 64,
    "metrics_report_interval_ms": 64,
}
"""Ray's knobs that Ray declares unsigned (``uint64_t`` / ``uint32_t`` in its
``ray_config_def.h``): Ray reads a negative number for them wrapped (``-1`` = the type's
largest value), so we do too (:func:`ray_knob_value`)."""


def ray_knob_value(name: str, value: Any) -> Any:
    """A value given for Ray's knob ``name`` (no ``RAY_`` prefix), as Ray reads it: a
    negative integer for an unsigned knob wraps; anything else is left to validation."""
    bits = RAY_UNSIGNED_BITS.get(name)
    if bits is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("-") and text[1:].isdigit()):
            return value
        value = int(text)
    if isinstance(value, int) and value < 0:
        return value % (1 << bits)
    return value


def names(path: str) -> str:
    """``health.period_ms`` -> ``health.period_ms (RAY_health_check_period_ms)``."""
    env = [var for var, p in ENV_VARS.items() if p == path]
    return f"{path} ({', '.join(env)})" if env else path
