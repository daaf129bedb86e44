"""Ray's RayConfig knobs: every one our GCS reads takes Ray 2.60's whole range, with Ray's
meaning, from ``--config_list`` (the drop-in), ``RAY_<name>`` and a config file alike.

Ranges are Ray's ``ray_config_def.h`` types and checks: the health-check knobs are
``int64_t`` that Ray's health-check manager requires ``>= 0`` (``RAY_CHECK_GE``); the
``uint64_t`` / ``uint32_t`` knobs read a negative number wrapped; the two task-event limits
are ``int64_t`` where a value <= 0 (task limit) or < 0 (profile limit) means no limit.
"""

from __future__ import annotations

import base64
import json

import pytest

from gcs.cli.dropin.flags import GcsServerFlags
from gcs.cli.dropin.main import build_config
from gcs.cli.dropin.ray_config import RayConfigError, decode_config_list, map_config
from gcs.config import ConfigError, GcsConfig, load_config
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore

U64, U32, I64 = 2**64 - 1, 2**32 - 1, 2**63 - 1

# Ray knob -> (our path, [(value given, value we hold)], [refused values])
RANGES: dict[str, tuple[str, list[tuple[int, int]], list[int]]] = {
    "health_check_initial_delay_ms": ("health.initial_delay_ms", [(0, 0), (I64, I64)], [-1]),
    "health_check_period_ms": ("health.period_ms", [(0, 0), (I64, I64)], [-1]),
    "health_check_timeout_ms": ("health.timeout_ms", [(0, 0), (I64, I64)], [-1]),
    "health_check_failure_threshold": ("health.failure_threshold", [(0, 0), (I64, I64)], [-1]),
    "gcs_pull_resource_loads_period_milliseconds": (
        "load_poll.period_ms",
        [(0, 0), (U64, U64), (-1, U64)],
        [],
    ),
    "maximum_gcs_dead_node_cached_count": (
        "max_dead_nodes_cached",
        [(0, 0), (U32, U32), (-1, U32)],
        [],
    ),
    "maximum_gcs_destroyed_actor_cached_count": (
        "max_dead_actors_cached",
        [(0, 0), (U32, U32), (-1, U32)],
        [],
    ),
    "maximum_gcs_dead_worker_cached_count": (
        "max_dead_workers_cached",
        [(0, 0), (U32, U32), (-1, U32)],
        [],
    ),
    "task_events_max_num_task_in_gcs": (
        "task_events_max_num_task_in_gcs",
        [(0, 0), (-1, -1), (-(2**63), -(2**63)), (I64, I64)],
        [],
    ),
    "task_events_max_num_profile_events_per_task": (
        "task_events_max_num_profile_events_per_task",
        [(0, 0), (-1, -1), (I64, I64)],
        [],
    ),
    "gcs_mark_task_failed_on_worker_dead_delay_ms": (
        "mark_task_failed_on_worker_dead_delay_ms",
        [(0, 0), (U64, U64), (-1, U64)],
        [],
    ),
    "gcs_mark_task_failed_on_job_done_delay_ms": (
        "mark_task_failed_on_job_done_delay_ms",
        [(0, 0), (U64, U64), (-1, U64)],
        [],
    ),
    "node_instances_replenish_interval_ms": (
        "node_instances_replenish_interval_ms",
        [(0, 0), (U64, U64), (-1, U64)],
        [],
    ),
    "redis_db_connect_retries": (  # int64; 0 or less = one attempt, no retry
        "redis_db_connect_retries",
        [(0, 0), (-1, -1), (I64, I64)],
        [],
    ),
    "redis_db_connect_wait_milliseconds": (  # int64, as Ray's
        "redis_db_connect_wait_milliseconds",
        [(0, 0), (I64, I64)],
        [],
    ),
    "event_stats_print_interval_ms": (  # int64; 0 or less = off
        "event_stats_print_interval_ms",
        [(0, 0), (I64, I64), (-1, -1)],
        [],
    ),
    "expired_job_clusters_gc_interval_ms": (
        "expired_job_clusters_gc_interval_ms",
        [(0, 0), (U64, U64), (-1, U64)],
        [],
    ),
    "metrics_report_interval_ms": (  # uint64; floored at 1000 ms when exporting, as Ray's
        "metrics_report_interval_ms",
        [(0, 0), (U64, U64), (-1, U64)],
        [],
    ),
}
ACCEPTED = [
    (name, path, given, held) for name, (path, cases, _) in RANGES.items() for given, held in cases
]
REFUSED = [(name, path, v) for name, (path, _, refused) in RANGES.items() for v in refused]


def _get(config: GcsConfig, path: str) -> object:
    value: object = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def config_list(knobs: dict[str, object]) -> str:
    return base64.b64encode(json.dumps(knobs).encode()).decode()


def dropin_config(knobs: dict[str, object], env: dict[str, str] | None = None) -> GcsConfig:
    flags = GcsServerFlags(config_list=config_list(knobs), session_name="session_t")
    env = env or {}
    return build_config(flags, map_config(flags, env), env)


def test_every_ray_named_knob_is_covered() -> None:
    """The table above lists every knob of ours that carries a Ray name (a new one must be
    added here with its Ray range)."""
    from gcs.config import RAY_FILE_KEYS

    ours = {name for name in RAY_FILE_KEYS if name not in {"external_storage_namespace"}}
    ours.discard("AUTH_MODE")
    ours.discard("testing_asio_delay_us")  # a string: tests/dropin/test_ray_test_hooks.py
    ours.discard("event_stats")  # a bool: tests/dropin/test_event_stats.py
    ours.discard("enable_metrics_collection")  # a bool: tests/server/test_ray_metrics.py
    assert ours == set(RANGES)


class TestRayRanges:
    @pytest.mark.parametrize(("name", "path", "given", "held"), ACCEPTED)
    def test_config_list_takes_the_whole_range(
        self, name: str, path: str, given: int, held: int
    ) -> None:
        """What Ray's fixtures pass (``health_check_initial_delay_ms: 0``) starts the GCS."""
        assert _get(dropin_config({name: given}), path) == held

    @pytest.mark.parametrize(("name", "path", "given", "held"), ACCEPTED)
    def test_environment_takes_the_whole_range(
        self, name: str, path: str, given: int, held: int
    ) -> None:
        assert _get(load_config(env={f"RAY_{name}": str(given)}), path) == held

    @pytest.mark.parametrize(("name", "path", "given", "held"), ACCEPTED)
    def test_config_file_takes_the_whole_range(
        self, tmp_path, name: str, path: str, given: int, held: int
    ) -> None:
        file = tmp_path / "gcs.yaml"
        file.write_text(f"{name}: {given}\n")
        assert _get(load_config(config_file=str(file), env={}), path) == held

    @pytest.mark.parametrize(("name", "path", "value"), REFUSED)
    def test_below_rays_range_is_refused_naming_the_knob(
        self, name: str, path: str, value: int
    ) -> None:
        """Ray's GCS aborts on a negative health-check knob; we refuse it in one line."""
        with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
            dropin_config({name: value})

    @pytest.mark.parametrize("extreme", ["zero", "max"])
    async def test_a_server_starts_and_stops_with_every_knob_at_an_end(self, extreme: str) -> None:
        """Not only accepted: every component starts with it (zero periods do not spin a
        loop, limits of 0 / no limit build their stores)."""
        knobs = {
            name: (cases[0][0] if extreme == "zero" else cases[1][0])
            for name, (_, cases, _) in RANGES.items()
        }
        config = dropin_config(knobs)
        server = GcsServer(
            GcsConfig(
                **{
                    **{f: getattr(config, f) for f in config.__dataclass_fields__},
                    "host": "127.0.0.1",
                    "port": 0,
                }
            ),
            store=MemoryStore(),
        )
        await server.start()
        try:
            assert server.port > 0
        finally:
            await server.stop()


class TestKnobSources:
    def test_config_list_beats_ray_env_beats_default(self) -> None:
        env = {"RAY_health_check_period_ms": "700", "RAY_health_check_timeout_ms": "800"}
        config = dropin_config({"health_check_period_ms": 0}, env)
        assert config.health.period_ms == 0  # config_list
        assert config.health.timeout_ms == 800  # environment
        assert config.health.failure_threshold == 5  # Ray's default

    def test_knobs_for_raylets_are_served_unchanged_and_named_once(self) -> None:
        knobs = {
            "health_check_initial_delay_ms": 0,
            "object_spilling_config": '{"type": "filesystem"}',
            "automatic_object_spilling_enabled": True,
            "not_a_ray_knob_at_all": 3,
        }
        flags = GcsServerFlags(config_list=config_list(knobs))
        mapped = map_config(flags, {})
        assert json.loads(mapped.raw_json) == knobs
        assert mapped.not_used == [
            "automatic_object_spilling_enabled",
            "not_a_ray_knob_at_all",
            "object_spilling_config",
        ]
        config = build_config(flags, mapped, {})
        assert json.loads(config.ray_internal_config) == knobs

    @pytest.mark.parametrize(
        ("encoded", "message"),
        [
            ("%%%", "not a valid base64"),
            (base64.b64encode(b"[1, 2]").decode(), "must be a JSON object"),
            (base64.b64encode(b"{nope").decode(), "not JSON"),
        ],
    )
    def test_unusable_config_list_is_one_line(self, encoded: str, message: str) -> None:
        with pytest.raises(RayConfigError, match=message):
            decode_config_list(encoded)

    def test_empty_config_list_is_no_overrides(self) -> None:
        assert decode_config_list("") == {}
        assert dropin_config({}).ray_internal_config == ""

    @pytest.mark.parametrize(
        ("knobs", "env", "expected"),
        [
            ({}, {}, False),
            ({}, {"RAY_enable_autoscaler_v2": "1"}, True),
            ({"enable_autoscaler_v2": True}, {}, True),
            ({"enable_autoscaler_v2": False}, {"RAY_enable_autoscaler_v2": "1"}, False),
        ],
    )
    def test_autoscaler_v2_flag_follows_ray(self, knobs, env, expected: bool) -> None:
        flags = GcsServerFlags(config_list=config_list(knobs))
        assert map_config(flags, env).autoscaler_v2 is expected


class TestStorage:
    def test_no_redis_is_rays_in_memory_store(self) -> None:
        assert map_config(GcsServerFlags(), {}).storage == "memory://"

    def test_redis_flags_make_the_url(self) -> None:
        flags = GcsServerFlags(
            redis_address="10.0.0.9",
            redis_port=6380,
            redis_enable_ssl=True,
            redis_username="user",
            redis_password="p@ss:w/rd",
        )
        assert map_config(flags, {}).storage == "rediss://user:p%40ss%3Aw%2Frd@10.0.0.9:6380/0"

    def test_redis_password_without_user(self) -> None:
        flags = GcsServerFlags(redis_address="h", redis_port=1, redis_password="pw")
        assert map_config(flags, {}).storage == "redis://:pw@h:1/0"

    def test_namespace_comes_from_rays_knob(self) -> None:
        flags = GcsServerFlags(
            redis_address="h",
            redis_port=1,
            config_list=config_list({"external_storage_namespace": "team-a"}),
        )
        config = build_config(flags, map_config(flags, {}), {})
        assert config.namespace == "team-a" and config.storage == "redis://h:1/0"

    def test_rocksdb_is_our_embedded_store_under_its_path(self, tmp_path) -> None:
        flags = GcsServerFlags(
            config_list=config_list({"gcs_storage": "rocksdb", "gcs_storage_path": str(tmp_path)})
        )
        config = build_config(flags, map_config(flags, {}), {})
        assert config.storage == f"sqlite+aiosqlite:///{tmp_path}/gcs.sqlite3"
        assert config.data_dir == str(tmp_path)

    @pytest.mark.parametrize(
        ("flags", "env", "message"),
        [
            (GcsServerFlags(redis_address="h"), {}, "--redis_port"),
            (GcsServerFlags(), {"RAY_gcs_storage": "rocksdb"}, "gcs_storage_path"),
            (GcsServerFlags(), {"RAY_gcs_storage": "etcd"}, "not one of memory, redis, rocksdb"),
            (GcsServerFlags(), {"RAY_gcs_storage": "redis"}, "--redis_address"),
        ],
    )
    def test_unusable_storage_is_refused(self, flags, env, message: str) -> None:
        with pytest.raises(RayConfigError, match=message):
            map_config(flags, env)


class TestDropInPins:
    def test_binds_every_interface_serves_no_metrics_port_and_no_virtual_head(self) -> None:
        env = {"GCS_HEAD": "1", "GCS_DASHBOARD": "1", "GCS_METRICS_PORT": "9379"}
        config = dropin_config({}, env)
        assert config.host == "0.0.0.0" and config.metrics_port == -1
        assert not config.head and not config.dashboard and not config.head_raylet
        assert config.session_name == "session_t"
