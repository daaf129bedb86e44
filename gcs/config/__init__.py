"""Server configuration: frozen dataclasses, units in names, Ray's defaults.

Precedence: CLI flag > environment (``GCS_*``; Ray's ``RAY_<name>`` where Ray has the knob)
> config file (YAML) > default.

Modules, one job each: ``schema`` (the dataclasses), ``keys`` (environment variables,
Ray's knob names and how Ray reads them), ``load`` (file, environment and flags merged into
the schema), ``checks`` (validation, the storage URL and ``--ha`` rules), ``errors``.
Every public name is re-exported here: ``from gcs.config import X``.
"""

from gcs.config.checks import (
    HA_MIN_RENEW_MS,
    HA_TTL_RANGE_MS,
    REQUEST_OVERHEAD_BYTES,
    STORAGE_FORMS,
    check_ha,
    check_limits,
    kv_put_request_bytes,
    storage_scheme_ok,
    storage_url_problem,
    validate,
)
from gcs.config.errors import ConfigError
from gcs.config.keys import (
    DEFAULT_METRICS_PORT,
    ENV_VARS,
    EVENT_LOOPS,
    LOG_LEVELS,
    RAY_FILE_KEYS,
    RAY_UNSIGNED_BITS,
    TOKEN_ENV_VARS,
    ray_knob_value,
)
from gcs.config.load import load_config
from gcs.config.schema import (
    GcsConfig,
    HaConfig,
    HealthCheckConfig,
    Http2Limits,
    LoadPollConfig,
    RayletIoConfig,
    RedisConfig,
    RequestLimits,
)

__all__ = [
    "DEFAULT_METRICS_PORT",
    "ENV_VARS",
    "EVENT_LOOPS",
    "HA_MIN_RENEW_MS",
    "HA_TTL_RANGE_MS",
    "LOG_LEVELS",
    "RAY_FILE_KEYS",
    "RAY_UNSIGNED_BITS",
    "REQUEST_OVERHEAD_BYTES",
    "STORAGE_FORMS",
    "TOKEN_ENV_VARS",
    "ConfigError",
    "GcsConfig",
    "HaConfig",
    "HealthCheckConfig",
    "Http2Limits",
    "LoadPollConfig",
    "RayletIoConfig",
    "RedisConfig",
    "RequestLimits",
    "check_ha",
    "check_limits",
    "kv_put_request_bytes",
    "load_config",
    "ray_knob_value",
    "storage_scheme_ok",
    "storage_url_problem",
    "validate",
]
