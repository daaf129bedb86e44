"""``gcs.config`` is a package of modules with one job each, and keeps its front door:
every public name of the old one-file module (``PUBLIC``, as it stood) is still
``from gcs.config import X``."""

from __future__ import annotations

import importlib
import pathlib

import gcs.config

CONFIG = pathlib.Path(gcs.config.__file__).parent

PUBLIC = [
    "DEFAULT_METRICS_PORT",
    "ENV_VARS",
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


class TestTheConfigPackage:
    def test_it_is_a_package_of_modules_under_600_lines(self) -> None:
        """Split by job (schema, keys, load, checks, errors), none over 600 lines."""
        assert (CONFIG / "__init__.py").is_file() and CONFIG.name == "config"
        sizes = {p.name: len(p.read_text().splitlines()) for p in CONFIG.glob("*.py")}
        assert {"schema.py", "keys.py", "load.py", "checks.py"} <= set(sizes)
        assert {name: n for name, n in sizes.items() if n > 600} == {}

    def test_every_public_name_is_still_imported_from_gcs_config(self) -> None:
        """Every name the one-file module had is still exported, and each one resolves."""
        assert set(PUBLIC) <= set(gcs.config.__all__)
        module = importlib.import_module("gcs.config")
        for name in PUBLIC:
            assert getattr(module, name) is not None

    def test_ha_support_is_not_listed_twice(self) -> None:
        """Which stores take ``--ha`` is the store registry's row, not a second set here."""
        assert not hasattr(gcs.config, "HA_SCHEMES")
        for module in ("schema", "keys", "load", "checks", "errors"):
            assert "HA_SCHEMES" not in (CONFIG / f"{module}.py").read_text()
