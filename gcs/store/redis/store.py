"""Redis backend over ``redis.asyncio``, laid out as Ray 2.60 lays out its GCS tables.

Deployments (``gcs.store.redis.connect``): one server; a master behind Redis Sentinel, named
by the address of a sentinel (Ray's way) or by ``redis+sentinel://h1,h2,h3/<master>/<db>``;
or a Redis Cluster.  The store finds the master at ``open()`` and follows it when it moves.

Layout (``namespace`` must not contain ``@``):

* table ``T`` → one hash ``RAY<namespace>@T``; field = raw key bytes, value = raw bytes;
* counter ``C`` → a plain string key ``RAY<namespace>@C`` incremented with ``INCRBY``
  (Ray's ``JobCounter`` lives at the same place);
* ``RAY<namespace>@__gcs_op:<write id hex>`` → short-lived write-id markers (below);
  ``RAY<namespace>@__gcs_inc:<token>`` → the same for counter increments.
* the KV table's fields use the injective (namespace, key) encoding of
  ``gcs/managers/kv.py`` (``@namespace_<escaped ns>:<key>``; Ray's bytes for Ray's own
  namespaces).  ``open()`` migrates a hash written in the old layout (empty-namespace keys
  stored raw) once, atomically, in one Lua script, and copies the cluster id and session name
  into ``RAY<namespace>@GCS_META``; the field ``__kv_layout`` of that hash records it.
* in a Redis Cluster every key is ``{RAY<namespace>}@...`` instead: the braces make the
  prefix a hash tag, so all keys of one GCS share one slot and a batch's script is never
  refused as cross-slot (``gcs.store.redis.cluster``).

Atomicity: a :class:`WriteBatch` is one Lua script (``EVALSHA``, reloaded with ``EVAL``
after ``NOSCRIPT``) that checks every condition and only then applies every ``HSET``/``HDEL``;
Redis runs a script without interleaving, so a batch is never half-applied and conditions
cannot race (``gcs.store.redis.scripts``).

High availability (``ha=True``, ``gcs serve --ha``; ``gcs.store.ha``): the same scripts'
HA variants also refuse a deposed leader's write (fencing) and append the batch to the
namespace's change stream in the same atomic step; the lease is a hash and a ``PX`` key
(layout in ``gcs.store.redis.scripts``, replies in ``gcs.store.redis.ha``).  Lease changes
``WAIT`` for replicas like writes.  Without ``ha`` the ordinary scripts run unchanged.

Durability: a write returns only after Redis replied to the script.  With
``appendonly yes`` + ``appendfsync always`` Redis (>= 7) replies only after the AOF write was
fsynced, so an acknowledged write survives ``kill -9`` of Redis and of the GCS.  Production
deployments need exactly those two settings (``appendfsync everysec`` can lose the last
second; RDB snapshots alone lose everything since the last snapshot).  ``open()`` logs a
warning when the server says otherwise.

Replication: Redis copies writes to replicas asynchronously, so a failover can lose what
the old master had not passed on.  After each batch the store sends ``WAIT n timeout`` on
the same connection (pipelined with the script: no extra round trip) and acknowledges only
once ``n`` replicas have the batch (``RedisOptions.wait_replicas``: by default one whenever
the master has a replica).  A WAIT that falls short answers StoreOutcomeUnknown ("may have
been applied"); ``landed()`` answers True only once the batch is on ``n`` replicas too.  A
failed condition is recorded in the batch's marker when waiting, so the "no" is replicated
before it is given.  What this does and does not promise: docs/operations.md.

Outages and definite answers: every socket operation has a timeout, so a dead Redis never
hangs a call.  A batch's script sets the marker ``__gcs_op:<write_id>`` = ``1`` in the same
atomic step, so a retry of a batch that did land is recognised and not applied twice (no
spurious ``StoreConflict``).  ``write`` retries a few times with backoff and tracks whether
any attempt may have reached Redis (the connection was up when the script was sent).  When
retries are exhausted:

* no attempt was sent (Redis refused connections throughout) → :class:`StoreUnavailable`;
* else it resolves the outcome with :meth:`RedisStore.landed` (bounded): return normally if
  it landed, StoreUnavailable if not, :class:`StoreOutcomeUnknown` if Redis stays silent
  (paused, SIGSTOPped, partitioned).

``landed`` is a fence: one script that answers from the marker, or, when there is none, sets
it to ``0`` so a copy of the batch still sitting in a socket buffer finds it and does nothing.
Markers of landed writes live ``op_marker_ttl_s``; fences live ``fence_ttl_s`` (longer: they
must outlast any stalled copy).  Increments carry a per-call token that makes a retry
idempotent; one that may have landed (or was not replicated in time) is reported as
StoreUnavailable, which only skips counter values (counters promise monotonicity, not
density).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import structlog
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from gcs.base.clock import Clock, SystemClock
from gcs.store.base import (
    META_CLUSTER_ID,
    META_SESSION_NAME,
    PRESENT,
    TABLE_KV,
    TABLE_META,
    Store,
    WriteBatch,
)
from gcs.store.errors import (
    StoreConflict,
    StoreCorrupt,
    StoreError,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from gcs.store.ha import Change, ChangeCursor, HaStore, LeaseInfo, StoreFenced
from gcs.store.ha_parts import (
    check_fence_epoch,
    check_lease_args,
    cursor_of,
    encode_batch,
    seq_of,
)
from gcs.store.redis import ha as redis_ha
from gcs.store.redis import scripts
from gcs.store.redis.connect import connect
from gcs.store.redis.options import RedisOptions
from gcs.store.redis.runner import (
    Exhausted,
    Fenced,
    ScriptRunner,
)
from gcs.store.redis.topology import Topology, TopologyError

__all__ = ["RedisOptions", "RedisStore"]

log = structlog.get_logger("gcs.store.redis")

_HMGET_CHUNK = 1000
_HSCAN_COUNT = 1000

_KV_LAYOUT = "2"
_IDENTITY_COPIES = (
    (b"@namespace_cluster:ray_cluster_id", META_CLUSTER_ID),
    (b"@namespace_session:session_name", META_SESSION_NAME),
)


class RedisStore(Store, HaStore):
    """:class:`Store` over one Redis deployment (``redis://``, ``rediss://``, ``unix://``,
    ``redis+sentinel://``; a sentinel or cluster node behind a plain URL is recognised)."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "default",
        options: RedisOptions = RedisOptions.default,
        ha: bool = False,
        clock: Clock | None = None,
    ) -> None:
        """``clock``: what waits between attempts and blocked reads run on (the
        server passes its own; a store built alone uses the system clock)."""
        if "@" in namespace:
            raise ValueError(f"namespace {namespace!r} must not contain '@' (Ray's key layout)")
        self.url = url
        self.namespace = namespace
        self._safe_url = _redact(url)
        self._options = options
        self._prefix = f"RAY{namespace}@".encode()
        self._topology: Topology | None = None
        self._clock = clock or SystemClock()
        self._runner = ScriptRunner(self._safe_url, options, self._clock, lambda: self._topology)
        self._ha = ha
        """``gcs serve --ha``: writes go through the fenced scripts and feed the change
        stream (``gcs.store.redis.scripts``); without it they cost what they always did."""
        self._ha_keys = redis_ha.HaKeys.of(self._prefix)
        self._fence: int = 0
        """The epoch this store's writes carry (0: not fenced yet)."""

    @property
    def topology(self) -> Topology | None:
        """How the store reaches its master (None before ``open()``)."""
        return self._topology

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._topology is not None:
            return
        try:
            topology = await connect(self.url, self._options)
        except TopologyError as err:
            raise StoreError(str(err)) from err
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as err:
            raise StoreUnavailable(f"{self._safe_url}: open failed: {err}") from err
        except redis_errors.RedisError as err:
            raise StoreError(f"{self._safe_url}: open failed: {err}") from err
        try:
            self._prefix = topology.key_prefix(self.namespace)
            self._ha_keys = redis_ha.HaKeys.of(self._prefix)
            try:
                await topology.bind(self._prefix)
            except TopologyError as err:
                raise StoreError(str(err)) from err
            await self._runner.command(topology, "open", "PING")
            await self._migrate_layout(topology)
        except BaseException:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await topology.aclose()
            raise
        self._topology = topology
        log.info(
            "redis_store_opened",
            url=self._safe_url,
            wait_replicas=self._options.wait_replicas,
            **topology.describe(),
        )
        await self._warn_if_not_durable(topology.client)
        if not self._ha:
            await self._warn_if_ha_namespace()

    async def _migrate_layout(self, topology: Topology) -> None:
        args: list[Any] = [_KV_LAYOUT]
        for kv_field, meta_field in _IDENTITY_COPIES:
            args += [kv_field, meta_field]
        moved = await self._runner.command(
            topology,
            "migrate",
            "EVAL",
            scripts.MIGRATE_KV_LAYOUT,
            2,
            self._hash(TABLE_KV),
            self._hash(TABLE_META),
            *args,
        )
        if int(moved):
            log.info("redis_kv_layout_migrated", url=self._safe_url, keys_rewritten=int(moved))

    async def _warn_if_ha_namespace(self) -> None:
        """A store without ``ha`` on a namespace an HA leader serves bypasses its fence and
        its standbys' change stream: say so (every process on a namespace must agree)."""
        keys = [self._ha_keys.state, self._ha_keys.lease]
        try:
            info = redis_ha.parse_lease(
                await self._read_script("open", scripts.READ_LEASE, keys, [])
            )
        except StoreError:
            return  # only a warning: never fail an open over it
        if info is not None:
            log.warning(
                "redis_ha_namespace_without_ha",
                url=self._safe_url,
                namespace=self.namespace,
                holder=info.holder,
                epoch=info.epoch,
                hint="an HA leader holds this namespace's lease; start every GCS on it "
                "with --ha, or stop them first",
            )

    async def close(self) -> None:
        topology, self._topology = self._topology, None
        if topology is not None:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await topology.aclose()

    async def _warn_if_not_durable(self, client: Redis) -> None:
        try:
            config = await client.config_get("append*")
        except (redis_errors.RedisError, OSError):
            return  # CONFIG is often disabled on managed Redis; nothing to check then
        settings = {_text(k): _text(v) for k, v in config.items()}
        appendonly, appendfsync = settings.get("appendonly"), settings.get("appendfsync")
        if appendonly != "yes" or appendfsync != "always":
            log.warning(
                "redis_not_durable",
                url=self._safe_url,
                appendonly=appendonly,
                appendfsync=appendfsync,
                hint="acknowledged writes can be lost on a crash; "
                "set appendonly yes and appendfsync always",
            )

    # -- reads ---------------------------------------------------------------------------------

    async def get(self, table: str, key: bytes) -> bytes | None:
        value = await self._read("get", "HGET", self._hash(table), key)
        return bytes(value) if value is not None else None

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        wanted = list(dict.fromkeys(keys))
        found: dict[bytes, bytes] = {}
        for start in range(0, len(wanted), _HMGET_CHUNK):
            chunk = wanted[start : start + _HMGET_CHUNK]
            values = await self._read("multi_get", "HMGET", self._hash(table), *chunk)
            found.update((k, bytes(v)) for k, v in zip(chunk, values, strict=True) if v is not None)
        return found

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return await self._hscan(table, match=None)

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        if not prefix:
            return await self.get_all(table)
        found = await self._hscan(table, match=_glob_escape(prefix) + b"*")
        return {k: v for k, v in found.items() if k.startswith(prefix)}

    async def scan_keys(self, table: str, prefix: bytes, *, max_bytes: int) -> list[bytes] | None:
        """HSCAN page by page, values dropped as each page arrives, stopping once the keys
        pass ``max_bytes`` (Redis 7.0 has no HSCAN NOVALUES; HKEYS would return them all)."""
        name = self._hash(table)
        extra: tuple[Any, ...] = ("MATCH", _glob_escape(prefix) + b"*") if prefix else ()
        keys: list[bytes] = []
        total, cursor = 0, 0
        while True:
            cursor, page = await self._read(
                "scan", "HSCAN", name, cursor, *extra, "COUNT", _HSCAN_COUNT
            )
            for key in page:
                if key.startswith(prefix):
                    total += len(key)
                    if total > max_bytes:
                        return None
                    keys.append(bytes(key))
            if cursor == 0:
                return keys

    async def _hscan(self, table: str, *, match: bytes | None) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        name = self._hash(table)
        extra: tuple[Any, ...] = ("MATCH", match) if match is not None else ()
        cursor = 0
        while True:
            cursor, page = await self._read(
                "scan", "HSCAN", name, cursor, *extra, "COUNT", _HSCAN_COUNT
            )
            found.update((bytes(k), bytes(v)) for k, v in page.items())
            if cursor == 0:
                return found

    async def read_counter(self, counter: str) -> int:
        value = await self._read("read_counter", "GET", self._key(counter))
        try:
            return int(value) if value is not None else 0
        except ValueError as err:
            raise StoreCorrupt(f"counter {counter!r} holds {value!r}, not an integer") from err

    async def _read(self, what: str, *args: Any) -> Any:
        topology = self._topology
        if topology is None:
            raise StoreUnavailable(f"{self._safe_url}: store is not open")
        return await self._runner.command(topology, what, *args)

    # -- writes --------------------------------------------------------------------------------

    async def write(self, batch: WriteBatch) -> None:
        if not batch and not batch.conditions:
            return
        hashes: dict[bytes, int] = {}
        # KEYS[1] is the marker (then, with ha, the HA hash and the stream), so hash
        # number n is KEYS[n + first] (Lua is 1-based).
        first = 4 if self._ha else 2

        def index(table: str) -> int:
            return hashes.setdefault(self._hash(table), len(hashes) + first)

        args: list[Any] = [
            self._options.op_marker_ttl_s,
            0,  # record a failed condition: set below once the WAIT target is known
            len(batch.conditions),
            len(batch.puts),
            len(batch.deletes),
        ]
        fence = self._fence
        if self._ha:
            changes = encode_batch(batch)
            args += [fence, self._options.changes_max_entries, changes]
        for cond in batch.conditions:
            if cond.expected is None:
                args += [index(cond.table), cond.key, 0, b""]
            elif cond.expected is PRESENT:
                args += [index(cond.table), cond.key, 2, b""]
            else:
                args += [index(cond.table), cond.key, 1, cond.expected]
        for table, key, value in batch.puts:
            args += [index(table), key, value]
        for table, key in batch.deletes:
            args += [index(table), key]
        keys = [self._write_marker(batch.write_id), *hashes]
        script = scripts.BATCH
        if self._ha:
            keys[1:1] = [self._ha_keys.state, self._ha_keys.changes]
            script = scripts.BATCH_HA
        write_id = batch.write_id
        try:
            ran = await self._runner.attempts(script, keys, args, record_flag_at=1)
        except Fenced as fenced:
            raise StoreFenced(fence, fenced.current) from None
        except Exhausted as failed:
            last = failed.last
            if not failed.maybe_sent:
                raise StoreUnavailable(f"{self._safe_url}: write failed: {failed.reason}") from last
            try:
                landed = await self.landed(write_id)
            except StoreUnavailable as err:
                raise StoreOutcomeUnknown(
                    write_id, f"{self._safe_url}: write may have landed: {failed.reason}; {err}"
                ) from last
            if landed:
                return
            raise StoreUnavailable(
                f"{self._safe_url}: write failed and did not land: {failed.reason}"
            ) from last
        result = int(ran.result)
        if result == 1:
            raise StoreUnavailable(f"{self._safe_url}: write {write_id.hex()} was fenced")
        if result < 0:
            if not ran.replicated:
                raise StoreUnavailable(
                    f"{self._safe_url}: a condition failed but the state it was checked "
                    f"against reached {ran.acked} of {ran.wanted} replicas; nothing written"
                )
            failed_condition = batch.conditions[-result - 1]
            raise StoreConflict(failed_condition.table, failed_condition.key)
        if not ran.replicated:
            raise StoreOutcomeUnknown(write_id, self._runner.short_of_replicas(ran))

    async def landed(self, write_id: bytes) -> bool:
        keys = [self._write_marker(write_id)]
        try:
            ran = await self._runner.attempts(scripts.FENCE, keys, [self._options.fence_ttl_s])
        except Exhausted as failed:
            raise StoreUnavailable(
                f"{self._safe_url}: cannot tell whether write landed: {failed.reason}"
            ) from failed.last
        if not int(ran.result):
            return False
        if not ran.replicated:
            raise StoreUnavailable(
                f"{self._safe_url}: write landed on the master but "
                f"{self._runner.short_of_replicas(ran)}"
            )
        return True

    async def increment(self, counter: str, by: int = 1) -> int:
        if by < 1:
            raise ValueError("increment must be >= 1")
        keys = [self._key(counter), self._increment_marker()]
        args: list[Any] = [by, self._options.op_marker_ttl_s]
        script = scripts.INCREMENT
        fence = self._fence
        if self._ha:
            keys += [self._ha_keys.state, self._ha_keys.changes]
            args += [fence, self._options.changes_max_entries, counter.encode()]
            script = scripts.INCREMENT_HA
        try:
            ran = await self._runner.attempts(script, keys, args)
        except Fenced as fenced:
            raise StoreFenced(fence, fenced.current) from None
        except Exhausted as failed:
            raise StoreUnavailable(
                f"{self._safe_url}: increment failed: {failed.reason}"
            ) from failed.last
        if not ran.replicated:
            raise StoreUnavailable(
                f"{self._safe_url}: increment {self._runner.short_of_replicas(ran)}"
            )
        return int(ran.result)

    # -- HaStore (gcs.store.ha; the scripts: gcs.store.redis.scripts) -----------------------

    def _require_ha(self) -> None:
        if not self._ha:
            raise RuntimeError("this RedisStore was built without ha=True (gcs serve --ha)")

    async def _lease_script(self, what: str, script: str, args: list[Any]) -> int:
        """Run a lease script (with WAIT, like a write: a grant a failover could lose would
        let two holders share an epoch); StoreUnavailable unless it is replicated."""
        self._require_ha()
        keys = [self._ha_keys.state, self._ha_keys.lease]
        try:
            ran = await self._runner.attempts(script, keys, args)
        except Exhausted as failed:
            raise StoreUnavailable(f"{self._safe_url}: {what} failed: {failed.reason}") from (
                failed.last
            )
        if int(ran.result) and not ran.replicated:
            raise StoreUnavailable(
                f"{self._safe_url}: {what} {self._runner.short_of_replicas(ran)}"
            )
        return int(ran.result)

    async def try_acquire_lease(self, holder: str, ttl_ms: int) -> int | None:
        check_lease_args(holder, ttl_ms)
        epoch = await self._lease_script("lease acquire", scripts.ACQUIRE_LEASE, [holder, ttl_ms])
        return epoch or None

    async def renew_lease(
        self, holder: str, epoch: int, ttl_ms: int, *, min_left_ms: int = 0
    ) -> bool:
        check_lease_args(holder, ttl_ms)
        args: list[Any] = [holder, epoch, ttl_ms, max(0, min_left_ms)]
        return bool(await self._lease_script("lease renewal", scripts.RENEW_LEASE, args))

    async def release_lease(self, holder: str, epoch: int) -> None:
        await self._lease_script("lease release", scripts.RELEASE_LEASE, [holder, epoch])

    async def read_lease(self) -> LeaseInfo | None:
        self._require_ha()
        keys = [self._ha_keys.state, self._ha_keys.lease]
        return redis_ha.parse_lease(
            await self._read_script("read_lease", scripts.READ_LEASE, keys, [])
        )

    def fence(self, epoch: int) -> None:
        self._require_ha()
        self._fence = check_fence_epoch(epoch)

    async def change_cursor(self) -> ChangeCursor:
        self._require_ha()
        seq = await self._read("change_cursor", "HGET", self._ha_keys.state, "seq")
        return cursor_of(int(seq) if seq is not None else 0)

    async def read_changes(
        self, after: ChangeCursor, *, block_ms: int = 0, limit: int = 10_000
    ) -> tuple[ChangeCursor, list[Change]]:
        self._require_ha()
        start = seq_of(after)
        keys = [self._ha_keys.state, self._ha_keys.changes]
        args = [f"({start}-0", min(limit, redis_ha.READ_COUNT)]
        reply = await self._read_script("read_changes", scripts.READ_CHANGES, keys, args)
        deadline = self._clock.monotonic_s() + block_ms / 1000
        # XREAD BLOCK holds its connection: wait in slices well inside the socket timeout
        slice_ms = max(1, int(self._options.socket_timeout_s * 500))
        while not redis_ha.answered(reply, start):
            remaining_ms = int((deadline - self._clock.monotonic_s()) * 1000)
            if remaining_ms <= 0:
                break
            block = min(remaining_ms, slice_ms)
            stream = self._ha_keys.changes
            await self._read(
                "read_changes", "XREAD", "COUNT", 1, "BLOCK", block, "STREAMS", stream, f"{start}-0"
            )
            reply = await self._read_script("read_changes", scripts.READ_CHANGES, keys, args)
        return redis_ha.parse_changes(reply, start, limit, self._safe_url)

    async def _read_script(self, what: str, script: str, keys: list[bytes], args: list[Any]) -> Any:
        """A read-only script on the master (EVALSHA, EVAL once after NOSCRIPT)."""
        topology = self._topology
        if topology is None:
            raise StoreUnavailable(f"{self._safe_url}: store is not open")
        sha = scripts.sha1(script)
        try:
            return await self._runner.command(
                topology, what, "EVALSHA", sha, len(keys), *keys, *args
            )
        except StoreError as err:
            if not isinstance(err.__cause__, redis_errors.NoScriptError):
                raise
        return await self._runner.command(topology, what, "EVAL", script, len(keys), *keys, *args)

    # -- helpers -------------------------------------------------------------------------------

    def _hash(self, table: str) -> bytes:
        return self._prefix + table.encode()

    def _key(self, counter: str) -> bytes:
        return self._prefix + counter.encode()

    def _increment_marker(self) -> bytes:
        return self._prefix + b"__gcs_inc:" + secrets.token_hex(16).encode()

    def _write_marker(self, write_id: bytes) -> bytes:
        return self._prefix + b"__gcs_op:" + write_id.hex().encode()


def _redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for error messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _glob_escape(raw: bytes) -> bytes:
    """Escape Redis glob metacharacters so ``raw`` matches literally in HSCAN MATCH."""
    out = bytearray()
    for byte in raw:
        if byte in b"*?[]\\":
            out += b"\\"
        out.append(byte)
    return bytes(out)
