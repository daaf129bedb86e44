"""Config precedence: flag > environment > file > default; bad values name the key."""

from __future__ import annotations

import pytest

from gcs.config import ConfigError, GcsConfig, load_config


class TestPrecedence:
    def test_defaults_match_ray(self) -> None:
        """Health checks and polling default to Ray 2.60's values."""
        config = load_config(env={})
        assert config.port == 6379
        assert (
            config.health.initial_delay_ms,
            config.health.period_ms,
            config.health.timeout_ms,
            config.health.failure_threshold,
        ) == (5000, 3000, 10000, 5)
        assert config.load_poll.period_ms == 1000
        assert config.max_dead_nodes_cached == 1000

    def test_flag_beats_env_beats_file(self, tmp_path) -> None:
        """Each layer overrides the one below it, key by key."""
        path = tmp_path / "gcs.yaml"
        path.write_text("port: 1111\nnamespace: fromfile\nhealth:\n  period_ms: 50\n")
        env = {"GCS_PORT": "2222", "RAY_health_check_failure_threshold": "9"}
        config = load_config(config_file=str(path), env=env, flags={"port": 3333})
        assert config.port == 3333
        assert config.namespace == "fromfile"
        assert config.health.period_ms == 50 and config.health.failure_threshold == 9

    def test_ray_env_names_are_honoured(self) -> None:
        """Ray's RAY_<knob> names configure the same knobs."""
        config = load_config(
            env={
                "RAY_gcs_pull_resource_loads_period_milliseconds": "250",
                "RAY_external_storage_namespace": "myns",
            }
        )
        assert config.load_poll.period_ms == 250 and config.namespace == "myns"

    def test_embedded_store_is_sqlite_under_data_dir(self, tmp_path) -> None:
        """No --storage: SQLite in the data directory."""
        url = GcsConfig(data_dir=str(tmp_path)).storage_url()
        assert url.startswith("sqlite+aiosqlite:///") and url.endswith("gcs.sqlite3")


class TestErrors:
    @pytest.mark.parametrize(
        ("text", "needle"),
        [
            ("port: notanumber\n", "port"),
            ("bogus: 1\n", "unknown key"),
            ("health:\n  nope: 1\n", "health"),
            ("- a\n- b\n", "mapping"),
            ("port: [1\n", "config file"),
        ],
    )
    def test_bad_file_names_the_place(self, tmp_path, text, needle) -> None:
        """Malformed YAML, unknown keys and wrong types name the offending key."""
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=needle):
            load_config(config_file=str(path), env={})

    def test_bad_env_value_names_the_key(self) -> None:
        """GCS_PORT=abc is an error that says which key."""
        with pytest.raises(ConfigError, match="port"):
            load_config(env={"GCS_PORT": "abc"})


class TestLimits:
    def test_defaults(self) -> None:
        """Ray's KV value limit (a 512 MiB message with a key) and bounded everything else."""
        limits = load_config(env={}).limits
        assert limits.max_kv_value_bytes == 512 * 1024 * 1024 - 128 * 1024
        assert limits.max_request_bytes == 8 * 1024 * 1024
        assert limits.max_address_bytes == 253
        assert limits.max_label_key_bytes == 317

    def test_flag_beats_env_beats_file(self, tmp_path) -> None:
        path = tmp_path / "gcs.yaml"
        path.write_text("limits:\n  max_name_bytes: 100\n  max_label_entries: 7\n")
        env = {"GCS_MAX_NAME_BYTES": "200", "GCS_MAX_KV_VALUE_BYTES": "4096"}
        config = load_config(config_file=str(path), env=env, flags={"limits.max_name_bytes": 300})
        assert config.limits.max_name_bytes == 300
        assert config.limits.max_kv_value_bytes == 4096
        assert config.limits.max_label_entries == 7

    def test_bad_limits_name_the_key(self) -> None:
        with pytest.raises(ConfigError, match=r"limits\.max_bundles: must be > 0"):
            load_config(env={"GCS_MAX_BUNDLES": "0"})
        with pytest.raises(ConfigError, match=r"limits\.max_kv_value_bytes"):
            load_config(env={"GCS_MAX_KV_VALUE_BYTES": str(600 * 1024 * 1024)})
        with pytest.raises(ConfigError, match="expected an integer"):
            load_config(env={"GCS_MAX_ID_BYTES": "lots"})


class TestValidation:
    @pytest.mark.parametrize(
        ("env", "needle"),
        [
            ({"RAY_health_check_timeout_ms": "-1"}, "health.timeout_ms"),
            ({"RAY_health_check_period_ms": "-5"}, "RAY_health_check_period_ms"),
            ({"RAY_health_check_failure_threshold": "-1"}, "failure_threshold"),
            ({"GCS_LOAD_POLL_SLICE_SIZE": "0"}, "slice_size"),
            ({"GCS_LOG_LEVEL": "LOUD"}, "log_level"),
            ({"GCS_METRICS_PORT": "-2"}, "metrics_port"),
            ({"GCS_PORT": "70000"}, "port"),
        ],
    )
    def test_out_of_range_knobs_are_refused(self, env, needle) -> None:
        """Below Ray's range (Ray's GCS refuses a negative health-check knob), or a zero
        where only our own knob would spin; every knob is checked once, the key named."""
        with pytest.raises(ConfigError, match=needle):
            load_config(env=env)

    def test_ray_flat_names_work_in_the_file(self, tmp_path) -> None:
        """``health_check_period_ms: 1234`` in YAML = ``health: {period_ms: 1234}``."""
        path = tmp_path / "gcs.yaml"
        path.write_text(
            "health_check_period_ms: 1234\n"
            "gcs_pull_resource_loads_period_milliseconds: 250\n"
            "health:\n  timeout_ms: 999\n"
        )
        config = load_config(config_file=str(path), env={})
        assert config.health.period_ms == 1234 and config.health.timeout_ms == 999
        assert config.load_poll.period_ms == 250

    def test_front_end_defaults_sit_below_everything(self) -> None:
        """``gcs serve`` passes its metrics port as a default: env and flags still win."""
        assert load_config(env={}, defaults={"metrics_port": 9379}).metrics_port == 9379
        env = {"GCS_METRICS_PORT": "0"}
        assert load_config(env=env, defaults={"metrics_port": 9379}).metrics_port == 0
        assert load_config(env={}).metrics_port == 0


class TestRealRayKeys:
    def test_head_and_versions_from_env_and_flags(self) -> None:
        cfg = load_config(
            env={"GCS_HEAD": "true", "GCS_PYTHON_VERSION": "3.10.14"},
            flags={"temp_dir": "/srv/ray"},
        )
        assert (cfg.head, cfg.python_version, cfg.temp_dir) == (True, "3.10.14", "/srv/ray")
        assert load_config(env={"GCS_HEAD": "0"}).head is False
        assert GcsConfig().head is False and GcsConfig().temp_dir == "/tmp/ray"

    @pytest.mark.parametrize(
        ("env", "needle"),
        [
            ({"GCS_HEAD": "maybe"}, "config.head (GCS_HEAD): expected true or false"),
            ({"GCS_PYTHON_VERSION": "3.11"}, "python_version (GCS_PYTHON_VERSION)"),
            ({"GCS_TEMP_DIR": "tmp/ray"}, "temp_dir (GCS_TEMP_DIR): must be an absolute path"),
            ({"RAY_task_events_max_num_task_in_gcs": "lots"}, "task_events_max_num_task_in_gcs"),
            (
                {"GCS_LOAD_POLL_SYNCER_MAX_STALENESS_MS": "-1"},
                "load_poll.syncer_max_staleness_ms",
            ),
        ],
    )
    def test_bad_values_name_the_key(self, env: dict[str, str], needle: str) -> None:
        with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            load_config(env=env)
