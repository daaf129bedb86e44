"""The configuration's schema: frozen dataclasses, units in names, Ray's defaults.

Every knob is a field here, its description the docstring under it (the reference,
docs/configuration.md, is generated from these: :mod:`gcs.cli.config_reference`).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

from gcs.store.redis.options import RedisOptions

__all__ = [
    "GcsConfig",
    "HaConfig",
    "HealthCheckConfig",
    "Http2Limits",
    "LoadPollConfig",
    "RayletIoConfig",
    "RedisConfig",
    "RequestLimits",
]


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
    """``h2``: the lean HTTP/2 client of ``gcs.rpc.raylet_io.h2_unary`` (~3x less GCS CPU per poll;
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
    """Abuse limits of the front server's HTTP/2 layer (``gcs.front.h2``); each default
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
    """Budget of the GCS -> raylet I/O layer (``gcs.rpc.raylet_io``); Ray has no such knobs.

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
    event_loop: str = "uvloop"
    """``gcs serve``'s event loop: ``uvloop`` (libuv's loop, in C: ~8% less GCS CPU per
    placement-group cycle than the standard loop, ~2 MB more resident memory) or
    ``asyncio`` (the standard library's)."""
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
    """Serve the GCS port with the front server (gcs.front): a lean HTTP/2 server answers
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
    """``disabled`` or ``token`` (Ray's ``RAY_AUTH_MODE``); see :mod:`gcs.base.auth`."""
    auth_token_path: str = ""
    """Token file for ``auth_mode: token``.  Empty = Ray's sources: ``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, then ``~/.ray/auth_token``.  From a config file it yields to
    those environment variables; from ``--auth-token-path`` it wins over them.  TLS is
    configured by Ray's environment only (``RAY_USE_TLS``, ``RAY_TLS_*``; :mod:`gcs.base.tls`)."""

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
    (:mod:`gcs.base.handler_delays`).  Empty: none wait."""

    ray_internal_config: str = ""
    """JSON object ``GetInternalConfig`` serves to raylets: Ray's ``--config_list`` under
    ``gcs-server`` (worker nodes adopt the head's system config from it).  Empty: the
    minimal config a raylet needs."""

    def storage_url(self) -> str:
        if self.storage:
            return self.storage
        path = pathlib.Path(self.data_dir).resolve() / "gcs.sqlite3"
        return f"sqlite+aiosqlite:///{path}"
