"""Server configuration: frozen dataclasses, units in names, Ray's defaults.

Precedence: CLI flag > environment (``GCS_*``; Ray's ``RAY_<name>`` where Ray has the knob)
> config file (YAML) > default.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import yaml

from gcs.auth import AuthConfigError, parse_mode
from gcs.handler_delays import DelaySpecError, HandlerDelays
from gcs.store.redis.options import RedisOptions


@dataclass(frozen=True, slots=True)
class HealthCheckConfig:
    """GCS -> raylet gRPC health checks (Ray: ``health_check_*``)."""

    initial_delay_ms: int = 5000
    """Wait after a node registers before its first health check (0: at once)."""
    period_ms: int = 3000
    """Time between health checks of one node (0: back to back, at the checker's tick)."""
    timeout_ms: int = 10000
    """Deadline of one health check (0: every check fails at once, as in Ray)."""
    failure_threshold: int = 5
    """Consecutive failed checks before the node is marked dead (0 acts as 1: Ray 2.60's
    checker at 0 would fail a node on its first *successful* check)."""
    max_concurrent: int = 512
    """Health RPCs in flight at once (Ray has no cap; we bound it for 2,000+ nodes)."""


@dataclass(frozen=True, slots=True)
class LoadPollConfig:
    """``NodeManagerService.GetResourceLoad`` polling (Ray: gcs_pull_resource_loads_period)."""

    period_ms: int = 1000
    """Time between load-poll rounds (every alive raylet once per round); 0 = no polling,
    as Ray's periodic runner skips a zero period (health checks still run)."""
    timeout_ms: int = 2000
    """Per-call deadline; a slow raylet only delays its own entry."""
    max_concurrent: int = 1024
    """GetResourceLoad calls in flight at once."""
    failure_backoff_max_ms: int = 10000
    """A raylet whose polls keep failing is polled 1, 2, 4, ... periods apart, at most this
    long apart (health checks, not polls, decide whether it is dead)."""
    slice_size: int = 64
    """Polls started, and replies applied, per event-loop turn: a round of 2,000 never holds
    the loop (and the requests it serves) in one iteration."""
    spread: float = 0.5
    """Fraction of the period over which a round's slices are started (0: back to back);
    each node is still polled once per period, but replies no longer arrive in one burst."""
    syncer_max_staleness_ms: int = 3000
    """Adaptive polling: a raylet streaming syncer views whose view has not changed since its
    last poll, and whose last poll showed no pending demand, is polled only this often (its
    resources, idle time and draining come from the syncer; only new demand on a node whose
    view did not move can be this late, plus a round).  Nodes with pending demand, without a
    syncer stream, or whose view changed are polled every period.  At or below the
    health-check period a poll reply doubles as the heartbeat, so backed-off nodes cost no
    extra health checks (the default is that period).  0 = every node every period, as Ray
    does."""
    transport: str = "h2"
    """``h2``: the lean HTTP/2 client of ``gcs.rpc.raylets.h2_unary`` (~3x less GCS CPU per poll;
    a raylet it cannot talk to falls back to grpc), or ``grpc`` (grpc.aio for every call)."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Bounds on what one request may carry (every violation is INVALID_ARGUMENT naming the
    field).  Ray has few such limits; each default is Ray's own where it has one, else chosen
    well above what a real cluster sends and far below what would hurt the GCS."""

    max_id_bytes: int = 64
    """Binary ids without a fixed size (subscriber/publisher ids, ids inside specs).  Ray's
    largest id is 28 bytes."""
    max_name_bytes: int = 512
    """Text names and ids: node, job and placement-group names, virtual-cluster ids, template
    ids, resource names, namespaces, pubsub keys."""
    max_text_bytes: int = 64 * 1024
    """Free text kept or forwarded: drain reasons, death messages, paths."""
    max_address_bytes: int = 253
    """Host names and IP literals (DNS's limit)."""
    max_label_key_bytes: int = 317
    """Ray's label-key syntax: a 253-byte DNS prefix, ``/`` and a 63-byte name."""
    max_label_value_bytes: int = 256
    """Ray checks 63 on ``ray start``; the GCS accepts some slack for system labels."""
    max_label_entries: int = 256
    max_map_entries: int = 100_000
    """Largest resource map (a node's resources include one entry per placement-group
    bundle resource, so this is large).  Ray sets none: its own
    ``test_advanced_2.py::test_many_custom_resources`` starts a node with 10,000 custom
    resources (10,005 entries with CPU, memory and the node's own), which 10,000 refused."""
    max_repeated_entries: int = 100_000
    """Largest repeated field in a request (node ids, keys, commands, bundles...)."""
    max_bundles: int = 10_000
    """Bundles in one placement group."""
    max_kv_key_bytes: int = 64 * 1024
    max_kv_value_bytes: int = 512 * 1024 * 1024 - 128 * 1024
    """The largest value one 512 MiB gRPC message (Ray's ``max_grpc_message_size``) carries
    beside a key at its limit.  Runtime-env packages are KV values: Ray's clients refuse one
    of ``GCS_STORAGE_MAX_SIZE`` (that same 512 MiB) or more, and Ray's own
    ``test_large_file_boundary`` uploads one 1 MiB short of it (535,822,497 bytes, which
    500 MiB refused).  Under Redis's 512 MiB string limit."""
    max_request_bytes: int = 8 * 1024 * 1024
    """An encoded request, checked before decoding (decoded protobuf messages take up to ~30x
    their encoded size).  ``InternalKVPut`` is allowed ``max_kv_value_bytes`` plus a key."""
    max_record_bytes: int = 4 * 1024 * 1024
    """A record other than a KV value persisted from one request (job data, autoscaling
    state, cluster config, placement-group spec)."""
    max_reply_bytes: int = 512 * 1024 * 1024
    """A reply that grows with stored data (InternalKVKeys / MultiGet, GetAll*Info...) stops
    being built past this (at most ``grpc_max_message_bytes``) and is RESOURCE_EXHAUSTED
    naming the limit: ask with a limit, filters or a narrower prefix."""


@dataclass(frozen=True, slots=True)
class Http2Limits:
    """Abuse limits of the front server's HTTP/2 layer (``gcs.rpc.front.h2``); each default
    is nghttp2's or grpc C-core's (as Ray's ``gcs_server`` sets it).  Crossing one ends the
    connection with GOAWAY ENHANCE_YOUR_CALM."""

    reset_burst: int = 1000
    """RST_STREAM frames a connection may send at once (nghttp2's stream reset rate limit;
    the "rapid reset" attack, CVE-2023-44487)."""
    reset_rate: float = 33.0
    """RST_STREAM frames regained per second after the burst."""
    glitch_burst: int = 10000
    """Suspicious frames a connection may send at once: empty DATA without END_STREAM,
    PRIORITY, unknown frame types, DATA after END_STREAM (nghttp2's glitch limit)."""
    glitch_rate: float = 330.0
    """Suspicious frames regained per second after the burst."""
    settings_burst: int = 100
    """SETTINGS frames a connection may send at once (each must be acknowledged; a client
    sends a handful)."""
    settings_rate: float = 10.0
    """SETTINGS frames regained per second after the burst."""
    max_continuations: int = 8
    """CONTINUATION frames after one HEADERS, empty ones included (nghttp2's default)."""
    max_settings_entries: int = 32
    """Entries in one SETTINGS frame (nghttp2's default)."""
    max_header_list_bytes: int = 65536
    """SETTINGS_MAX_HEADER_LIST_SIZE, and the largest header block accepted."""
    min_ping_interval_ms: int = 60000
    """A PING sooner than this after the previous one is a strike (grpc C-core's
    ``grpc.http2.min_recv_ping_interval_without_data_ms`` as Ray's ``gcs_server`` sets it;
    with no call open the interval is two hours); strikes are forgiven when the server
    sends a reply."""
    max_ping_strikes: int = 2
    """Strikes allowed before the connection is closed (C-core's default; 0 = no limit)."""
    max_outbound_acks: int = 1000
    """PING / SETTINGS acknowledgements written to a client that does not read them
    (nghttp2's default)."""


@dataclass(frozen=True, slots=True)
class RayletIoConfig:
    """Budget of the GCS -> raylet I/O layer (``gcs.rpc.raylets``); Ray has no such knobs.

    Every raylet client holds up to two sockets (the HTTP/2 poll connection and a gRPC
    channel), so 50,000 raylets cannot all stay connected under a typical fd limit: clients
    beyond ``max_open_clients`` are closed least-recently-used first (idle ones only).
    """

    max_open_clients: int = 0
    """Raylet clients kept open at once; 0 = derived from RLIMIT_NOFILE (a quarter of the
    limit, at least 256 fds, is left for GCS clients, the store and subscribers)."""
    max_in_flight: int = 0
    """Raylet calls in flight at once, all kinds together; 0 = min(1024, 3/4 of the clients)."""
    max_calls_per_s: int = 5000
    """Background raylet calls (polls, health checks, restart notifications) started per
    second at most, in bursts of up to one second's worth; 0 = no limit.  Calls to
    unreachable raylets fail in microseconds, so concurrency alone does not bound the CPU.
    While the event loop lags the rate drops (halved per 0.1 s lagging > 100 ms, down to a
    quarter), and grows back by 10% per calm 0.1 s."""
    startup_contacts_per_s: int = 2000
    """After a restart, first contacts with raylets known from the store (NotifyGCSRestart,
    first poll) are spread evenly, with jitter, over ``nodes / rate`` seconds."""


@dataclass(frozen=True, slots=True)
class RedisConfig:
    """Redis storage (``storage: redis://...``, ``redis+sentinel://...``, a sentinel's or a
    Redis Cluster node's address; ``gcs.store.redis``)."""

    username: str = ""
    """Redis ACL user (Ray's ``--redis_username``); a user in the storage URL wins."""
    password: str = ""
    """Redis password (Ray's ``--redis_password``), sent to sentinels too as Ray does; a
    password in the storage URL wins."""
    wait_replicas: int = -1
    """Replicas that must have a write before it is acknowledged (Redis ``WAIT``): -1 = one
    whenever the master has a connected replica, 0 = never wait, N = always N."""
    wait_timeout_ms: int = 1000
    """How long one ``WAIT`` may block; falling short answers "may have been applied"."""

    def options(self) -> RedisOptions:
        return RedisOptions(
            username=self.username,
            password=self.password,
            wait_replicas=self.wait_replicas,
            wait_timeout_ms=self.wait_timeout_ms,
        )


@dataclass(frozen=True, slots=True)
class HaConfig:
    """A hot standby (``gcs serve --ha``, :mod:`gcs.server.ha`): two or more GCS processes
    on one Redis or PostgreSQL store; the one holding the store's lease serves, the others
    follow the store's change stream and take over when the lease lapses."""

    enabled: bool = False
    """Run as a member of an HA group (Redis or PostgreSQL storage only)."""
    lease_ttl_ms: int = 2000
    """How long the leader's lease lasts without a renewal: after a leader dies, a standby
    takes over within about this plus its load time (the default aims at <= 3 s)."""
    renew_interval_ms: int = 500
    """How often the leader renews its lease (at most half the TTL: a renewal may be late
    once without the lease lapsing)."""
    holder: str = ""
    """This member's name in the lease (empty: ``<hostname>:<pid>:<random>``)."""
    status_port: int = -1
    """A gRPC health port of this member's own, answered by standbys too: SERVING while it
    leads, NOT_SERVING as a standby (the GCS port is the leader's alone).  -1 = none, 0 =
    any free port."""
    lock_dir: str = ""
    """Directory of the members' lock files (``gcs.server.ha_lock``): a standby on the same
    host as a leader killed -9 takes over at once instead of after the lease's TTL.  Empty:
    ``<system temp dir>/gcs-ha-<hash of storage URL and namespace>``.  Members on one host
    must share it; ``off`` disables it (the TTL alone detects a dead leader)."""


HA_TTL_RANGE_MS = (200, 60_000)
"""Allowed ``ha.lease_ttl_ms``: shorter leases lapse on a slow store round trip; longer ones
make a takeover wait that long."""
HA_MIN_RENEW_MS = 50


@dataclass(frozen=True, slots=True)
class GcsConfig:
    host: str = "127.0.0.1"
    """Bind address of the gRPC server and the metrics endpoint."""
    node_ip_address: str = ""
    """This node's address as Ray names it (``gcs-server --node-ip-address``): what the GCS
    says it is at (its address for the head's processes, ``NodeAddress`` of its metrics).
    Empty: ``host``, or the host's primary address when ``host`` is a wildcard."""
    port: int = 6379
    """gRPC port (Ray's GCS port); 0 = any free port."""
    storage: str = ""
    """Store URL; empty = embedded SQLite under ``data_dir``."""
    namespace: str = "default"
    """Key namespace per cluster in a shared backend (Ray: external_storage_namespace)."""
    redis_db_connect_retries: int = 120
    """Ray's knob and default: a store (any backend) unreachable at start is tried again
    this many times, ``redis_db_connect_wait_milliseconds`` apart, before ``gcs serve``
    gives up saying the store is unreachable (Ray: 120 x 500 ms = 60 s; <= 0: no retry)."""
    redis_db_connect_wait_milliseconds: int = 500
    """Ray's knob and default: the wait between two attempts to reach the store."""
    data_dir: str = ".gcs-data"
    """Directory of the embedded SQLite store (relative to the working directory)."""
    metrics_port: int = 0
    """Prometheus HTTP port; 0 = pick a free one, -1 = disabled.  ``gcs serve`` defaults to
    ``DEFAULT_METRICS_PORT`` (this dataclass default serves embedding and tests)."""
    log_format: str = "auto"
    """``json``, ``console`` or ``auto`` (console on a TTY)."""
    log_level: str = "info"
    """debug, info, warning, error or critical."""
    session_name: str = ""
    """Empty = ``session_<timestamp>_<pid>`` generated on first start and persisted."""
    python_version: str = ""
    """Full Python version (``3.11.7``) published in ``CLUSTER_METADATA``; Ray refuses
    workers and drivers whose interpreter differs (``RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL``,
    default patch).  Empty = this server's own interpreter: set it when the GCS runs on
    another Python than the cluster."""
    head: bool = False
    """Be the head of a real Ray cluster: answer Ray's head-node lookup with a virtual head
    (no raylet) so unmodified ``ray start --address`` workers join (``gcs.managers.head``)."""
    temp_dir: str = "/tmp/ray"
    """The virtual head's ``temp_dir`` (Ray's default); its ``session_dir`` is
    ``<temp_dir>/<session_name>``.  Workers started without ``--temp-dir`` use it."""
    dashboard: bool = False
    """With ``head``: run Ray's dashboard head beside the GCS (``ray list``, ``ray job``, the
    web UI), supervised: restarted with backoff, stopped with the GCS; its log is
    ``<temp_dir>/<session_name>/logs/dashboard.log`` (``gcs.server.head_processes``)."""
    dashboard_host: str = ""
    """The dashboard's HTTP bind address; empty = ``host``."""
    dashboard_port: int = 8265
    """The dashboard's HTTP port (Ray's default)."""
    head_raylet: bool = False
    """With ``head``: run a real raylet on the GCS host (``ray start --address --block``) and
    register it as the head node; ``ray job submit`` needs it (Ray runs job drivers on the
    head node).  Supervised like the dashboard."""
    head_raylet_args: str = ""
    """Extra ``ray start`` arguments of the head raylet (shell words), e.g.
    ``--num-cpus=0 --dashboard-agent-listen-port=52366``."""
    ray_python: str = ""
    """Interpreter with ``ray[default]`` 2.60 installed that runs the dashboard and the head
    raylet; empty = the one running the GCS."""
    health: HealthCheckConfig = field(default_factory=HealthCheckConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    ha: HaConfig = field(default_factory=HaConfig)
    load_poll: LoadPollConfig = field(default_factory=LoadPollConfig)
    raylet_io: RayletIoConfig = field(default_factory=RayletIoConfig)
    max_dead_nodes_cached: int = 1000
    """Dead nodes kept for GetAllNodeInfo (oldest dropped first)."""
    max_dead_workers_cached: int = 1000
    """Dead workers kept in the WORKERS table (oldest dropped from memory and store first)."""
    task_events_max_num_task_in_gcs: int = 100_000
    """Task attempts whose events are kept (Ray's name and default); past it finished tasks
    are evicted first, then actor tasks, then the rest, each counted as dropped.  0 or less:
    no limit (Ray's meaning of -1, and of 0 in its ``> 0`` check)."""
    task_events_max_num_profile_events_per_task: int = 1000
    """Profile events kept per task attempt (Ray's name and default); negative: no limit."""
    mark_task_failed_on_worker_dead_delay_ms: int = 1000
    """After a worker died, its task attempts still not finished are marked FAILED this
    much later (the worker's last task events may still arrive; Ray's default)."""
    mark_task_failed_on_job_done_delay_ms: int = 15000
    """After a job finished, its task attempts still not finished are marked FAILED this
    much later (Ray's default)."""
    max_dead_actors_cached: int = 100_000
    """Dead actors kept for GetAllActorInfo (oldest dropped first, from memory and store)."""
    raylet_rpc_timeout_ms: int = 30000
    """Deadline for forwarded raylet calls (DrainRaylet, Resize)."""
    limits: RequestLimits = field(default_factory=RequestLimits)
    grpc_max_message_bytes: int = 512 * 1024 * 1024
    """Largest gRPC message sent or received (Ray's limit)."""
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
    """Period of virtual-cluster dead-node replenishment (ant-ray's name and default; 0 =
    off, as ant-ray's periodic runner skips a zero period)."""
    expired_job_clusters_gc_interval_ms: int = 30000
    """Period of the GC of finished, idle job clusters (ant-ray's name and default; 0 =
    off)."""
    front_server: bool = True
    """Serve the GCS port with the front server (gcs.rpc.front): a lean HTTP/2 server answers
    every unary call itself (grpc.aio's own handlers) and relays streaming calls to grpc.aio
    on a private Unix socket.  False: grpc.aio serves the port directly."""
    front_max_concurrent_streams: int = 4096
    """Front server: concurrent streams per client connection (more are refused)."""
    front_max_buffered_bytes: int = 64 * 1024 * 1024
    """Front server: request bytes held per connection before its flow-control window is
    closed, and reply bytes waiting on a client that does not read before it is dropped
    (one stream may hold more: a single large message or reply)."""
    front_buffer_budget_bytes: int = 256 * 1024 * 1024
    """Front server: request and reply bytes held for all connections together.  Past it, no
    connection gets more flow-control credit (one holding almost nothing keeps 64 KiB, one
    large message at a time goes through) and a connection that would queue more replies
    than 1 MiB for a client that does not read is dropped."""
    http2: Http2Limits = field(default_factory=Http2Limits)
    auth_mode: str = "disabled"
    """``disabled`` or ``token`` (Ray's ``RAY_AUTH_MODE``); see :mod:`gcs.auth`."""
    auth_token_path: str = ""
    """Token file for ``auth_mode: token``.  Empty = Ray's sources: ``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, then ``~/.ray/auth_token``.  From a config file it yields to
    those environment variables; from ``--auth-token-path`` it wins over them.  TLS is
    configured by Ray's environment only (``RAY_USE_TLS``, ``RAY_TLS_*``; :mod:`gcs.tls`)."""

    event_stats: bool = True
    """Ray's ``event_stats``: keep the per-handler figures ``event_stats_print_interval_ms``
    logs (:mod:`gcs.server.event_stats`)."""
    event_stats_print_interval_ms: int = 60_000
    """Ray's knob and default: every this many ms, log Ray's "Main service Event stats"
    block (calls and execution time per handler); 0 or less = off (Ray's -1)."""

    metrics_agent_port: int = 0
    """Ray's ``--metrics-agent-port``: the gRPC port of this node's dashboard agent, where
    Ray's GCS exports its metrics (OTLP) under Ray's names (``ray_actors``,
    ``ray_placement_groups``, ...; :mod:`gcs.server.ray_metrics`) for Ray's dashboards.
    0 (Ray's, which starts the GCS before the agent): the port the head node registers
    with, once it does; -1: not exported.  Our own ``/metrics`` port is unaffected."""
    metrics_report_interval_ms: int = 10_000
    """Ray's knob and default: export to the metrics agent this often (at least 1000 ms,
    as Ray floors it)."""
    enable_metrics_collection: bool = True
    """Ray's knob: false exports nothing to the metrics agent."""

    testing_asio_delay_us: str = ""
    """Ray's test knob: GCS handlers that wait before they run, ``NAME=MIN_US:MAX_US,...``
    (:mod:`gcs.handler_delays`).  Empty: none wait."""

    ray_internal_config: str = ""
    """JSON object ``GetInternalConfig`` serves to raylets: Ray's ``--config_list`` under
    ``gcs-server`` (worker nodes adopt the head's system config from it).  Empty: the
    minimal config a raylet needs."""

    def storage_url(self) -> str:
        if self.storage:
            return self.storage
        path = pathlib.Path(self.data_dir).resolve() / "gcs.sqlite3"
        return f"sqlite+aiosqlite:///{path}"


DEFAULT_METRICS_PORT = 9379
"""Where ``gcs serve`` exports Prometheus metrics unless told otherwise."""

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

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
    if target is bool:
        return _coerce_bool(value, where)
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _coerce_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{where}: expected true or false, got {value!r}")


def _set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    node = tree
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _build(cls: type, data: Mapping[str, Any], where: str, path: str = "") -> Any:
    """``cls`` from ``data``; ``path`` is ``cls``'s place in the tree (``health.``), so an
    error names a value's environment variable too."""
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
            kwargs[name] = _build(type(default), value, f"{where}.{name}", f"{path}{name}.")
        else:
            target = type(f.default) if f.default is not dataclasses.MISSING else str
            env = [var for var, p in ENV_VARS.items() if p == f"{path}{name}"]
            named = f"{where}.{name}" + (f" ({', '.join(env)})" if env else "")
            kwargs[name] = _coerce(value, target, named)
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
    defaults: Mapping[str, Any] | None = None,
) -> GcsConfig:
    """Merge default < ``defaults`` < file < environment < flags (flags as dotted paths).

    ``defaults`` lets a front end (``gcs serve``) choose defaults of its own, such as
    a fixed metrics port, without changing the dataclass defaults embedders rely on.
    """
    tree: dict[str, Any] = {}
    for path, value in (defaults or {}).items():
        _set_path(tree, path, value)
    if config_file:
        try:
            loaded = yaml.safe_load(pathlib.Path(config_file).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from exc
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"config file {config_file}: top level must be a mapping")
        tree = _merge(tree, _ray_keys_to_paths(loaded))
    env = os.environ if env is None else env
    env_tree: dict[str, Any] = {}
    for var, path in ENV_VARS.items():
        if var in env and env[var] != "":
            _set_path(env_tree, path, ray_knob_value(var.removeprefix("RAY_"), env[var]))
    tree = _merge(tree, env_tree)
    if any(env.get(var, "").strip() for var in TOKEN_ENV_VARS):
        tree.pop("auth_token_path", None)  # env > file; the flag (below) still wins
    flag_tree: dict[str, Any] = {}
    for path, value in (flags or {}).items():
        if value is not None:
            _set_path(flag_tree, path, value)
    tree = _merge(tree, flag_tree)
    where = f"config ({config_file})" if config_file else "config"
    config = _build(GcsConfig, tree, where)
    try:
        config = dataclasses.replace(
            config, auth_mode=parse_mode(config.auth_mode, f"{where}.auth_mode")
        )
    except AuthConfigError as err:
        raise ConfigError(str(err)) from None
    validate(config, where)
    return config


def _ray_keys_to_paths(loaded: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in loaded.items():
        if isinstance(key, str) and key in RAY_FILE_KEYS:
            _set_path(out, RAY_FILE_KEYS[key], ray_knob_value(key, value))
    rest = {k: v for k, v in loaded.items() if k not in RAY_FILE_KEYS}
    return _merge(rest, out)


def _get_path(config: Any, path: str) -> Any:
    value = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _names(path: str) -> str:
    """``health.period_ms`` -> ``health.period_ms (RAY_health_check_period_ms)``."""
    env = [var for var, p in ENV_VARS.items() if p == path]
    return f"{path} ({', '.join(env)})" if env else path


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
