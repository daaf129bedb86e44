"""Redis backend over ``redis.asyncio``, laid out as Ray 2.60 lays out its GCS tables.

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

Atomicity: a :class:`WriteBatch` is one Lua script (``EVALSHA``, reloaded with ``SCRIPT LOAD``
after ``NOSCRIPT``) that checks every condition and only then applies every ``HSET``/``HDEL``;
Redis runs a script without interleaving, so a batch is never half-applied and conditions
cannot race.

Durability: a write returns only after Redis replied to the script.  With
``appendonly yes`` + ``appendfsync always`` Redis (>= 7) replies only after the AOF write was
fsynced, so an acknowledged write survives ``kill -9`` of Redis and of the GCS.  Production
deployments need exactly those two settings (``appendfsync everysec`` can lose the last
second; RDB snapshots alone lose everything since the last snapshot).  ``open()`` logs a
warning when the server says otherwise.

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
must outlast any stalled copy).  Increments keep redis-py's own retry with a per-call token;
one that may have landed is reported as StoreUnavailable, which only skips counter values
(counters promise monotonicity, not density).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import secrets
import select
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import structlog
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

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
    StoreFull,
    StoreOutcomeUnknown,
    StoreUnavailable,
)

__all__ = ["RedisOptions", "RedisStore"]

log = structlog.get_logger("gcs.store.redis")

_HMGET_CHUNK = 1000
_HSCAN_COUNT = 1000
_UNAVAILABLE_REPLIES = ("READONLY", "MISCONF", "LOADING", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN")

# KEYS[1] = write-id marker; KEYS[2..] = table hashes.  ARGV[1] = marker TTL (s),
# ARGV[2..4] = number of conditions, puts, deletes; then per condition (hash index, field,
# kind 0 absent / 1 equal / 2 present, expected), per put (hash index, field, value), per
# delete (hash index, field).  Returns 0 when applied (now or by an earlier attempt),
# 1 when the write id was fenced by landed() (not applied), -i when condition i failed.
_BATCH_SCRIPT = """
local done = redis.call('GET', KEYS[1])
if done then
  if done == '1' then return 0 end
  return 1
end
local ncond, nput, ndel = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local i = 5
for c = 1, ncond do
  local current = redis.call('HGET', KEYS[tonumber(ARGV[i])], ARGV[i + 1])
  local kind = ARGV[i + 2]
  if kind == '0' then
    if current then return -c end
  elseif kind == '2' then
    if not current then return -c end
  elseif current ~= ARGV[i + 3] then
    return -c
  end
  i = i + 4
end
for p = 1, nput do
  redis.call('HSET', KEYS[tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2])
  i = i + 3
end
for d = 1, ndel do
  redis.call('HDEL', KEYS[tonumber(ARGV[i])], ARGV[i + 1])
  i = i + 2
end
redis.call('SET', KEYS[1], '1', 'EX', tonumber(ARGV[1]))
return 0
"""

# KEYS[1] = write-id marker; ARGV[1] = fence TTL (s).  1: the batch landed; 0: it did not
# and now never will (the marker is set to '0', which the batch script refuses).
_FENCE_SCRIPT = """
local done = redis.call('GET', KEYS[1])
if done then
  if done == '1' then return 1 end
  return 0
end
redis.call('SET', KEYS[1], '0', 'EX', tonumber(ARGV[1]))
return 0
"""

# KEYS[1] = KV hash, KEYS[2] = META hash; ARGV[1] = layout version, ARGV[2..] = pairs of
# (KV field, META field) to copy when the META field is absent.  Rewrites old-layout KV
# fields (see gcs/managers/kv.py) once; returns the number of fields rewritten.
_MIGRATE_SCRIPT = """
if redis.call('HGET', KEYS[2], '__kv_layout') == ARGV[1] then return 0 end
local all = redis.call('HGETALL', KEYS[1])
local moves = {}
for i = 1, #all, 2 do
  local k = all[i]
  local target = nil
  local colon = nil
  if string.sub(k, 1, 11) == '@namespace_' then colon = string.find(k, ':', 12, true) end
  if colon and colon > 12 then
    local ns = string.sub(k, 12, colon - 1)
    if string.find(ns, '%', 1, true) then
      target = '@namespace_' .. (string.gsub(ns, '%%', '%%25')) .. string.sub(k, colon)
    end
  else
    target = '@namespace_:' .. k
  end
  if target then moves[#moves + 1] = {k, target, all[i + 1]} end
end
for _, m in ipairs(moves) do redis.call('HDEL', KEYS[1], m[1]) end
for _, m in ipairs(moves) do redis.call('HSET', KEYS[1], m[2], m[3]) end
for j = 2, #ARGV, 2 do
  local value = redis.call('HGET', KEYS[1], ARGV[j])
  if value and redis.call('HEXISTS', KEYS[2], ARGV[j + 1]) == 0 then
    redis.call('HSET', KEYS[2], ARGV[j + 1], value)
  end
end
redis.call('HSET', KEYS[2], '__kv_layout', ARGV[1])
return #moves
"""

_KV_LAYOUT = "2"
_IDENTITY_COPIES = (
    (b"@namespace_cluster:ray_cluster_id", META_CLUSTER_ID),
    (b"@namespace_session:session_name", META_SESSION_NAME),
)


class _NotSent(Exception):
    """The attempt failed before the script could reach Redis."""


class _MaybeSent(Exception):
    """The attempt failed after the script may have reached Redis."""


# KEYS[1] = counter, KEYS[2] = op marker; ARGV[1] = increment, ARGV[2] = marker TTL (s).
_INCREMENT_SCRIPT = """
local done = redis.call('GET', KEYS[2])
if done then return tonumber(done) end
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], value, 'EX', tonumber(ARGV[2]))
return value
"""


@dataclass(frozen=True, slots=True)
class RedisOptions:
    """Client tuning.  Worst case for a dead-but-reachable Redis is about
    ``(retries + 1) * socket_timeout_s`` before StoreUnavailable."""

    socket_timeout_s: float = 5.0
    """Per read/write on the socket."""
    connect_timeout_s: float = 2.0
    """Per connection attempt."""
    retries: int = 2
    """Retries after a connection error / timeout (exponential backoff, capped)."""
    backoff_base_s: float = 0.05
    backoff_cap_s: float = 0.5
    health_check_interval_s: float = 5.0
    """PING a pooled connection idle longer than this before reusing it."""
    op_marker_ttl_s: int = 300
    """How long a landed write's marker lives: ``landed()`` answers for that long."""
    fence_ttl_s: int = 86_400
    """How long a fence set by ``landed()`` lives (must outlast any stalled copy)."""

    default: ClassVar[RedisOptions]


RedisOptions.default = RedisOptions()


class RedisStore(Store):
    """:class:`Store` over one Redis server (``redis://``, ``rediss://`` or ``unix://``)."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "default",
        options: RedisOptions = RedisOptions.default,
    ) -> None:
        if "@" in namespace:
            raise ValueError(f"namespace {namespace!r} must not contain '@' (Ray's key layout)")
        self.url = url
        self.namespace = namespace
        self._safe_url = _redact(url)
        self._options = options
        self._prefix = f"RAY{namespace}@".encode()
        self._client: Redis | None = None
        self._increment_script: Any = None

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._client is not None:
            return
        opts = self._options
        client = Redis.from_url(
            self.url,
            socket_timeout=opts.socket_timeout_s,
            socket_connect_timeout=opts.connect_timeout_s,
            retry=Retry(
                ExponentialBackoff(cap=opts.backoff_cap_s, base=opts.backoff_base_s),
                opts.retries,
            ),
            retry_on_error=[redis_errors.ConnectionError, redis_errors.TimeoutError],
            health_check_interval=opts.health_check_interval_s,
            decode_responses=False,
        )
        try:
            async with self._translate("open", client):
                await client.ping()
        except StoreError:
            await client.aclose()
            raise
        self._increment_script = client.register_script(_INCREMENT_SCRIPT)
        try:
            async with self._translate("migrate", client):
                await self._migrate_layout(client)
        except StoreError:
            await client.aclose()
            raise
        self._client = client
        await self._warn_if_not_durable(client)

    async def _migrate_layout(self, client: Redis) -> None:
        args: list[Any] = [_KV_LAYOUT]
        for kv_field, meta_field in _IDENTITY_COPIES:
            args += [kv_field, meta_field]
        moved = await client.eval(
            _MIGRATE_SCRIPT, 2, self._hash(TABLE_KV), self._hash(TABLE_META), *args
        )  # type: ignore[misc]
        if int(moved):
            log.info("redis_kv_layout_migrated", url=self._safe_url, keys_rewritten=int(moved))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await client.aclose()

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
        async with self._translate("get") as client:
            value = await client.hget(self._hash(table), key)  # type: ignore[misc]
            return bytes(value) if value is not None else None  # type: ignore[arg-type]

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        wanted = list(dict.fromkeys(keys))
        found: dict[bytes, bytes] = {}
        async with self._translate("multi_get") as client:
            for start in range(0, len(wanted), _HMGET_CHUNK):
                chunk = wanted[start : start + _HMGET_CHUNK]
                values = await client.hmget(self._hash(table), chunk)  # type: ignore[misc]
                found.update(
                    (k, bytes(v))  # type: ignore[arg-type]
                    for k, v in zip(chunk, values, strict=True)
                    if v is not None
                )
        return found

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return await self._hscan(table, match=None)

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        if not prefix:
            return await self.get_all(table)
        found = await self._hscan(table, match=_glob_escape(prefix) + b"*")
        return {k: v for k, v in found.items() if k.startswith(prefix)}

    async def _hscan(self, table: str, *, match: bytes | None) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        async with self._translate("scan") as client:
            cursor = 0
            while True:
                cursor, page = await client.hscan(  # type: ignore[misc]
                    self._hash(table), cursor, match=match, count=_HSCAN_COUNT
                )
                found.update((bytes(k), bytes(v)) for k, v in page.items())  # type: ignore[arg-type,union-attr]
                if cursor == 0:
                    return found

    async def read_counter(self, counter: str) -> int:
        async with self._translate("read_counter") as client:
            value = await client.get(self._key(counter))
        try:
            return int(value) if value is not None else 0
        except ValueError as err:
            raise StoreCorrupt(f"counter {counter!r} holds {value!r}, not an integer") from err

    # -- writes --------------------------------------------------------------------------------

    async def write(self, batch: WriteBatch) -> None:
        if not batch and not batch.conditions:
            return
        hashes: dict[bytes, int] = {}

        def index(table: str) -> int:
            # KEYS[1] is the marker, so hash number n is KEYS[n + 2] (Lua is 1-based).
            return hashes.setdefault(self._hash(table), len(hashes) + 2)

        args: list[Any] = [
            self._options.op_marker_ttl_s,
            len(batch.conditions),
            len(batch.puts),
            len(batch.deletes),
        ]
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
        result = await self._run_definitely(_BATCH_SCRIPT, keys, args, batch.write_id)
        if result == 1:
            raise StoreUnavailable(f"{self._safe_url}: write {batch.write_id.hex()} was fenced")
        if result < 0:
            failed = batch.conditions[-result - 1]
            raise StoreConflict(failed.table, failed.key)

    async def landed(self, write_id: bytes) -> bool:
        keys = [self._write_marker(write_id)]
        last: BaseException | None = None
        for attempt in range(self._options.retries + 1):
            await self._backoff(attempt)
            try:
                return bool(await self._run_once(_FENCE_SCRIPT, keys, [self._options.fence_ttl_s]))
            except (_NotSent, _MaybeSent) as err:
                last = err.__cause__
        raise StoreUnavailable(f"{self._safe_url}: cannot tell whether write landed: {last}")

    async def _run_definitely(
        self, script: str, keys: list[bytes], args: list[Any], write_id: bytes
    ) -> int:
        """Run the batch script with retries; resolve an ambiguous end with the fence."""
        maybe_sent = False
        last: BaseException | None = None
        for attempt in range(self._options.retries + 1):
            await self._backoff(attempt)
            try:
                return int(await self._run_once(script, keys, args))
            except _NotSent as err:
                last = err.__cause__
            except _MaybeSent as err:
                maybe_sent, last = True, err.__cause__
        if not maybe_sent:
            raise StoreUnavailable(f"{self._safe_url}: write failed: {last}") from last
        try:
            landed = await self.landed(write_id)
        except StoreUnavailable as err:
            raise StoreOutcomeUnknown(
                write_id, f"{self._safe_url}: write may have landed: {last}; {err}"
            ) from last
        if landed:
            return 0
        raise StoreUnavailable(f"{self._safe_url}: write failed and did not land: {last}") from last

    async def _backoff(self, attempt: int) -> None:
        if attempt:
            opts = self._options
            await asyncio.sleep(min(opts.backoff_cap_s, opts.backoff_base_s * 2 ** (attempt - 1)))

    async def _run_once(self, script: str, keys: list[bytes], args: list[Any]) -> Any:
        """One EVALSHA on one pooled connection, telling "never sent" from "maybe sent".

        redis-py's own retry would hide which attempt reached Redis, so writes go here."""
        client = self._client
        if client is None:
            raise _NotSent() from StoreUnavailable(f"{self._safe_url}: store is not open")
        pool = client.connection_pool
        try:
            conn = await pool.get_connection()
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as err:
            raise _NotSent() from err
        try:
            try:
                # Connect and health-check first: a failure up to here sent nothing.  An
                # idle pooled connection whose socket is readable (EOF or stray bytes) is
                # stale: replace it, so a Redis that went away is never "maybe sent".
                await conn.connect()
                if _socket_readable(conn):
                    await conn.disconnect()
                    await conn.connect()
                await conn.check_health()
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as err:
                with contextlib.suppress(Exception):
                    await conn.disconnect()
                raise _NotSent() from err
            try:
                await conn.send_command(
                    "EVALSHA", _sha1(script), len(keys), *keys, *args, check_health=False
                )
                return await conn.read_response()
            except redis_errors.NoScriptError:
                await conn.send_command("EVAL", script, len(keys), *keys, *args, check_health=False)
                return await conn.read_response()
        except redis_errors.ResponseError as err:
            message = str(err)
            if _out_of_memory(err):  # refused at the first write: the script wrote nothing
                raise StoreFull(
                    f"{self._safe_url}: write refused, Redis is full: {message}"
                ) from err
            if message.startswith(_UNAVAILABLE_REPLIES):
                raise _NotSent() from err  # refused before running: nothing applied
            if message.startswith("WRONGTYPE"):
                raise StoreCorrupt(f"{self._safe_url}: unexpected key type: {message}") from err
            raise StoreError(f"{self._safe_url}: script failed: {message}") from err
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as err:
            with contextlib.suppress(Exception):
                await conn.disconnect()
            raise _MaybeSent() from err
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.disconnect()
            raise
        finally:
            await pool.release(conn)

    async def increment(self, counter: str, by: int = 1) -> int:
        if by < 1:
            raise ValueError("increment must be >= 1")
        keys = [self._key(counter), self._increment_marker()]
        async with self._translate("increment"):
            return int(
                await self._increment_script(keys=keys, args=[by, self._options.op_marker_ttl_s])
            )

    # -- helpers -------------------------------------------------------------------------------

    def _hash(self, table: str) -> bytes:
        return self._prefix + table.encode()

    def _key(self, counter: str) -> bytes:
        return self._prefix + counter.encode()

    def _increment_marker(self) -> bytes:
        return self._prefix + b"__gcs_inc:" + secrets.token_hex(16).encode()

    def _write_marker(self, write_id: bytes) -> bytes:
        return self._prefix + b"__gcs_op:" + write_id.hex().encode()

    @contextlib.asynccontextmanager
    async def _translate(self, what: str, client: Redis | None = None) -> AsyncIterator[Redis]:
        """Map redis-py errors onto the StoreError tree (boundary translation)."""
        client = client or self._client
        if client is None:
            raise StoreUnavailable(f"{self._safe_url}: store is not open")
        try:
            yield client
        except StoreError:
            raise
        except (
            redis_errors.ConnectionError,
            redis_errors.TimeoutError,
            OSError,
            TimeoutError,
        ) as err:
            raise StoreUnavailable(f"{self._safe_url}: {what} failed: {err}") from err
        except redis_errors.ResponseError as err:
            message = str(err)
            if _out_of_memory(err):
                raise StoreFull(
                    f"{self._safe_url}: {what} refused, Redis is full: {message}"
                ) from err
            if message.startswith(_UNAVAILABLE_REPLIES):
                raise StoreUnavailable(f"{self._safe_url}: {what} failed: {message}") from err
            if message.startswith("WRONGTYPE"):
                detail = f"{what}: unexpected key type: {message}"
                raise StoreCorrupt(f"{self._safe_url}: {detail}") from err
            raise StoreError(f"{self._safe_url}: {what} failed: {message}") from err
        except redis_errors.RedisError as err:
            raise StoreError(f"{self._safe_url}: {what} failed: {err}") from err


def _out_of_memory(err: redis_errors.ResponseError) -> bool:
    """Redis at ``maxmemory`` with noeviction ("OOM command not allowed when used memory >
    'maxmemory'"; redis-py strips the OOM prefix into the class).  Redis refuses a script at
    its first write and a plain command before it runs, so nothing was written."""
    return isinstance(err, redis_errors.OutOfMemoryError) or "> 'maxmemory'" in str(err)


def _socket_readable(conn: Any) -> bool:
    """Whether the connection's socket has an EOF or bytes waiting (one poll, no yield)."""
    reader = getattr(conn, "_reader", None)
    if reader is not None and (reader.at_eof() or getattr(reader, "_buffer", None)):
        return True
    writer = getattr(conn, "_writer", None)
    sock = writer.get_extra_info("socket") if writer is not None else None
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


@functools.cache
def _sha1(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()  # Redis names scripts by SHA-1


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
