"""Redis backend over ``redis.asyncio``, laid out as Ray 2.60 lays out its GCS tables.

Layout (``namespace`` must not contain ``@``):

* table ``T`` → one hash ``RAY<namespace>@T``; field = raw key bytes, value = raw bytes;
* counter ``C`` → a plain string key ``RAY<namespace>@C`` incremented with ``INCRBY``
  (Ray's ``JobCounter`` lives at the same place);
* ``RAY<namespace>@__gcs_op:<token>`` → short-lived markers that make retried writes
  exactly-once (below).

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

Outages: every socket operation has a timeout, so a dead Redis never hangs a call.  Connection
errors and timeouts are retried a few times with backoff (redis-py ``Retry``); a batch or
increment carries a random token whose marker the script writes in the same atomic step, so a
retry of a call that did land is recognised and not applied twice (no spurious
``StoreConflict``, no double increment).  When retries are exhausted the caller gets
:class:`StoreUnavailable`; the pool reconnects by itself on the next call once Redis is back.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import structlog
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from gcs.store.base import Store, WriteBatch
from gcs.store.errors import StoreConflict, StoreCorrupt, StoreError, StoreUnavailable

__all__ = ["RedisOptions", "RedisStore"]

log = structlog.get_logger("gcs.store.redis")

_HMGET_CHUNK = 1000
_HSCAN_COUNT = 1000
_UNAVAILABLE_REPLIES = ("READONLY", "MISCONF", "LOADING", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN")

# KEYS[1] = op marker; KEYS[2..] = table hashes.  ARGV[1] = marker TTL (s), ARGV[2..4] =
# number of conditions, puts, deletes; then per condition (hash index, field, present 0/1,
# expected), per put (hash index, field, value), per delete (hash index, field).
# Returns 0 when applied (now or by an earlier attempt), -i when condition i failed.
_BATCH_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local ncond, nput, ndel = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local i = 5
for c = 1, ncond do
  local current = redis.call('HGET', KEYS[tonumber(ARGV[i])], ARGV[i + 1])
  if ARGV[i + 2] == '0' then
    if current then return -c end
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
    """How long a write's retry marker lives (must exceed the longest retry sequence)."""

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
        self._batch_script: Any = None
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
        self._client = client
        self._batch_script = client.register_script(_BATCH_SCRIPT)
        self._increment_script = client.register_script(_INCREMENT_SCRIPT)
        await self._warn_if_not_durable(client)

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
            return bytes(value) if value is not None else None

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        wanted = list(dict.fromkeys(keys))
        found: dict[bytes, bytes] = {}
        async with self._translate("multi_get") as client:
            for start in range(0, len(wanted), _HMGET_CHUNK):
                chunk = wanted[start : start + _HMGET_CHUNK]
                values = await client.hmget(self._hash(table), chunk)  # type: ignore[misc]
                found.update(
                    (k, bytes(v)) for k, v in zip(chunk, values, strict=True) if v is not None
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
                found.update((bytes(k), bytes(v)) for k, v in page.items())
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
            present = cond.expected is not None
            args += [index(cond.table), cond.key, int(present), cond.expected or b""]
        for table, key, value in batch.puts:
            args += [index(table), key, value]
        for table, key in batch.deletes:
            args += [index(table), key]
        keys = [self._marker(), *hashes]
        async with self._translate("write"):
            result = int(await self._batch_script(keys=keys, args=args))
        if result < 0:
            failed = batch.conditions[-result - 1]
            raise StoreConflict(failed.table, failed.key)

    async def increment(self, counter: str, by: int = 1) -> int:
        if by < 1:
            raise ValueError("increment must be >= 1")
        keys = [self._key(counter), self._marker()]
        async with self._translate("increment"):
            return int(
                await self._increment_script(keys=keys, args=[by, self._options.op_marker_ttl_s])
            )

    # -- helpers -------------------------------------------------------------------------------

    def _hash(self, table: str) -> bytes:
        return self._prefix + table.encode()

    def _key(self, counter: str) -> bytes:
        return self._prefix + counter.encode()

    def _marker(self) -> bytes:
        return self._prefix + b"__gcs_op:" + secrets.token_hex(16).encode()

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
            if message.startswith(_UNAVAILABLE_REPLIES):
                raise StoreUnavailable(f"{self._safe_url}: {what} failed: {message}") from err
            if message.startswith("WRONGTYPE"):
                detail = f"{what}: unexpected key type: {message}"
                raise StoreCorrupt(f"{self._safe_url}: {detail}") from err
            raise StoreError(f"{self._safe_url}: {what} failed: {message}") from err
        except redis_errors.RedisError as err:
            raise StoreError(f"{self._safe_url}: {what} failed: {err}") from err


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
