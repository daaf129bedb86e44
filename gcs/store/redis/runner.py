"""One Lua script on the Redis master, retried, replicated, and honest about whether it
may have run: the write path of :class:`~gcs.store.redis.store.RedisStore`.

What an attempt can end in: a reply (:class:`Ran`, with how many replicas acknowledged it),
:class:`NotSent` (nothing reached Redis; maybe a redirect to follow), :class:`MaybeSent`
(the connection broke after the script was sent), :class:`Fenced` (the HA script refused a
deposed leader's write), and after the last attempt :class:`Exhausted`.  Waits between
attempts are on the injected clock.
"""

from __future__ import annotations

import contextlib
import select
from collections.abc import Callable
from typing import Any, NamedTuple

import structlog
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from gcs.base.clock import Clock
from gcs.store.errors import StoreCorrupt, StoreError, StoreFull, StoreUnavailable
from gcs.store.redis import ha as redis_ha
from gcs.store.redis import scripts
from gcs.store.redis.options import WAIT_AUTO, RedisOptions
from gcs.store.redis.topology import Topology

__all__ = [
    "MAX_REDIRECTS",
    "REFUSED",
    "Exhausted",
    "Fenced",
    "MaybeSent",
    "NotSent",
    "Ran",
    "ScriptRunner",
    "out_of_memory",
    "reply_code",
]

log = structlog.get_logger("gcs.store.redis")

MAX_REDIRECTS = 5
MAX_REDIRECTS = 5
REFUSED = frozenset(
    {"READONLY", "MISCONF", "LOADING", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN", "CLUSTERDOWN"}
)
"""Error replies of a command Redis did not run: nothing was applied, try again later."""


class NotSent(Exception):
    """The attempt failed before the script could run: nothing was applied."""

    def __init__(self, redirect: tuple[Redis, bool] | None = None) -> None:
        super().__init__()
        self.redirect = redirect
        """Where to send it instead (client, ``ASKING`` first) after MOVED / ASK."""


class Fenced(Exception):
    """The script refused a fenced store's write (``GCSFENCED``): nothing was applied."""

    def __init__(self, current: int) -> None:
        super().__init__(current)
        self.current = current


class MaybeSent(Exception):
    """The attempt failed after the script may have reached Redis."""


class Exhausted(Exception):
    """Every attempt failed; ``maybe_sent``: at least one may have run."""

    def __init__(self, maybe_sent: bool, last: BaseException | None) -> None:
        super().__init__(described(last))
        self.maybe_sent = maybe_sent
        self.last = last
        self.reason = described(last)
        """The last failure, with the Redis error code redis-py strips (``TRYAGAIN ...``)."""


class Ran(NamedTuple):
    """A script's reply and how many replicas acknowledged it (of ``wanted``)."""

    result: Any
    wanted: int
    acked: int

    @property
    def replicated(self) -> bool:
        return self.acked >= self.wanted


def described(err: BaseException | None) -> str:
    code = getattr(err, "status_code", None)
    return f"{code} {err}" if code else str(err)


def reply_code(err: redis_errors.RedisError) -> str:
    """The error code Redis sent (``READONLY``...); redis-py strips it from known errors."""
    code = getattr(err, "status_code", None)
    return code if code else str(err).split(" ", 1)[0]


class ScriptRunner:
    """Runs one Lua script on the current master of a topology: retries with backoff on
    the injected clock, follows MOVED / ASK, sends ``WAIT`` for replicas when there are
    any, and tells "never sent" (:class:`NotSent`) from "may have been sent"."""

    def __init__(
        self,
        safe_url: str,
        options: RedisOptions,
        clock: Clock,
        topology: Callable[[], Topology | None],
    ) -> None:
        self._safe_url = safe_url
        self._options = options
        self._clock = clock
        self._topology_of = topology
        self._replicas: dict[object, tuple[int, float]] = {}
        """Per master address: (replicas to wait for, when we last looked at it)."""
        self._check_interval_s = options.replica_check_interval_s

    @property
    def _topology(self) -> Topology | None:
        return self._topology_of()

    async def command(self, topology: Topology, what: str, *args: Any) -> Any:
        """One command on the master, following MOVED / ASK and one move of the master;
        redis-py errors become StoreErrors (boundary translation)."""
        client, asking, relocated = topology.client, False, False
        for _ in range(MAX_REDIRECTS):
            try:
                if not asking:
                    return await client.execute_command(*args)
                pipe = client.pipeline(transaction=False)
                pipe.execute_command("ASKING")
                pipe.execute_command(*args)
                return (await pipe.execute())[1]
            except redis_errors.AskError as err:  # MOVED too
                hop = await topology.redirected(err)
                if hop is None:
                    raise self.translated(what, err) from err
                client, asking = hop
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as err:
                if isinstance(err, redis_errors.RedisError) and reply_code(err) in REFUSED:
                    raise self.translated(what, err) from err
                await topology.lost()
                if relocated or topology.client is client:
                    raise self.translated(what, err) from err
                client, asking, relocated = topology.client, False, True
            except redis_errors.RedisError as err:
                raise self.translated(what, err) from err
        raise StoreUnavailable(f"{self._safe_url}: {what}: too many redirects")

    def translated(self, what: str, err: BaseException) -> StoreError:
        """Map a redis-py error onto the StoreError tree."""
        if isinstance(err, redis_errors.ResponseError):
            code = reply_code(err)
            if out_of_memory(err):
                return StoreFull(f"{self._safe_url}: {what} refused, Redis is full: {err}")
            if code in REFUSED:
                return StoreUnavailable(f"{self._safe_url}: {what} failed: {code} {err}")
            if code == "WRONGTYPE":
                return StoreCorrupt(f"{self._safe_url}: {what}: unexpected key type: {err}")
            return StoreError(f"{self._safe_url}: {what} failed: {err}")
        if isinstance(err, redis_errors.ConnectionError | redis_errors.TimeoutError | OSError):
            return StoreUnavailable(f"{self._safe_url}: {what} failed: {err}")
        return StoreError(f"{self._safe_url}: {what} failed: {err}")

    def short_of_replicas(self, ran: Ran) -> str:
        return (
            f"reached {ran.acked} of {ran.wanted} replicas within "
            f"{self._options.wait_timeout_ms} ms (WAIT); it may be lost in a failover"
        )

    async def attempts(
        self,
        script: str,
        keys: list[bytes],
        args: list[Any],
        *,
        record_flag_at: int | None = None,
    ) -> Ran:
        """Run ``script`` with retries and backoff, following redirects; raise Exhausted."""
        maybe_sent = False
        last: BaseException | None = None
        hop: tuple[Redis, bool] | None = None
        attempt = redirects = 0
        while attempt <= self._options.retries:
            topology = self._topology
            if topology is None:
                raise Exhausted(maybe_sent, StoreUnavailable(f"{self._safe_url}: not open"))
            if hop is None:
                await self._backoff(attempt)
            client, asking = hop or (topology.client, False)
            hop = None
            try:
                return await self._run_once(
                    client, script, keys, args, asking=asking, record_flag_at=record_flag_at
                )
            except NotSent as err:
                last = err.__cause__
                if err.redirect is not None and redirects < MAX_REDIRECTS:
                    redirects += 1
                    hop = err.redirect
                    continue
                if not isinstance(last, redis_errors.ResponseError):
                    await topology.lost()
            except MaybeSent as err:
                maybe_sent, last = True, err.__cause__
                await topology.lost()
            attempt += 1
        raise Exhausted(maybe_sent, last)

    async def _backoff(self, attempt: int) -> None:
        if attempt:
            opts = self._options
            await self._clock.sleep(
                min(opts.backoff_cap_s, opts.backoff_base_s * 2 ** (attempt - 1))
            )

    async def _run_once(
        self,
        client: Redis,
        script: str,
        keys: list[bytes],
        args: list[Any],
        *,
        asking: bool,
        record_flag_at: int | None,
    ) -> Ran:
        """One EVALSHA (+ WAIT) on one pooled connection, telling "never sent" from "maybe
        sent".  redis-py's own retry would hide which attempt reached Redis, so writes go
        here."""
        pool = client.connection_pool
        try:
            conn = await pool.get_connection()
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as err:
            raise NotSent() from err
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
                known = self._replicas.get(_address(conn))
                if (
                    known is not None
                    and self._clock.monotonic_s() - known[1] < self._check_interval_s
                ):
                    wanted = known[0]
                else:  # an ASK target is not the slot's master (yet): nothing to confirm
                    wanted = await self._wait_target(conn, confirm=not asking)
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as err:
                with contextlib.suppress(Exception):
                    await conn.disconnect()
                raise NotSent() from err
            if record_flag_at is not None:
                args[record_flag_at] = 1 if wanted else 0
            if wanted or asking:
                try:
                    result, acked = await self._eval(conn, script, keys, args, asking, wanted)
                except redis_errors.NoScriptError:
                    result, acked = await self._eval(
                        conn, script, keys, args, asking, wanted, load=True
                    )
            else:  # the ordinary path: one command, as cheap as it was before WAIT
                acked = 0
                await conn.send_command(
                    "EVALSHA", scripts.sha1(script), len(keys), *keys, *args, check_health=False
                )
                try:
                    result = await conn.read_response()
                except redis_errors.NoScriptError:
                    await conn.send_command(
                        "EVAL", script, len(keys), *keys, *args, check_health=False
                    )
                    result = await conn.read_response()
        except redis_errors.ResponseError as err:
            code = reply_code(err)
            if isinstance(err, redis_errors.AskError):  # MOVED too: not run here
                hop = await self._topology_redirect(err)
                raise NotSent(hop) from err
            if out_of_memory(err):  # refused at the first write: the script wrote nothing
                raise StoreFull(f"{self._safe_url}: write refused, Redis is full: {err}") from err
            if code in REFUSED:
                raise NotSent() from err  # refused before running: nothing applied
            if code == "WRONGTYPE":
                raise StoreCorrupt(f"{self._safe_url}: unexpected key type: {err}") from err
            if code == scripts.FENCED:
                raise Fenced(redis_ha.fenced_epoch(err)) from err
            raise StoreError(f"{self._safe_url}: script failed: {err}") from err
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as err:
            with contextlib.suppress(Exception):
                await conn.disconnect()
            if isinstance(err, redis_errors.RedisError) and reply_code(err) in REFUSED:
                raise NotSent() from err  # LOADING arrives as a ConnectionError
            raise MaybeSent() from err
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
        if wanted and acked < wanted:
            self._replicas.pop(_address(conn), None)  # look again before the next write
        return Ran(result, wanted, acked)

    async def _topology_redirect(
        self, err: redis_errors.ResponseError
    ) -> tuple[Redis, bool] | None:
        topology = self._topology
        return await topology.redirected(err) if topology is not None else None

    async def _eval(
        self,
        conn: Any,
        script: str,
        keys: list[bytes],
        args: list[Any],
        asking: bool,
        wanted: int,
        *,
        load: bool = False,
    ) -> tuple[Any, int]:
        """Send [ASKING] EVALSHA|EVAL [WAIT] in one write; read every reply (so the
        connection stays clean), then raise the script's error if it failed."""
        commands: list[tuple[Any, ...]] = []
        if asking:
            commands.append(("ASKING",))
        if load:
            commands.append(("EVAL", script, len(keys), *keys, *args))
        else:
            commands.append(("EVALSHA", scripts.sha1(script), len(keys), *keys, *args))
        if wanted:
            commands.append(("WAIT", wanted, self._options.wait_timeout_ms))
        await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        replies: list[Any] = []
        wait_s = self._options.socket_timeout_s + self._options.wait_timeout_ms / 1000
        for position in range(len(commands)):
            last = position == len(commands) - 1
            try:
                replies.append(
                    await conn.read_response(timeout=wait_s if wanted and last else None)
                )
            except redis_errors.ResponseError as err:
                replies.append(err)
        for reply in replies:
            if isinstance(reply, redis_errors.ResponseError):
                raise reply
        script_reply = replies[1 if asking else 0]
        return script_reply, int(replies[-1]) if wanted else 0

    async def _wait_target(self, conn: Any, *, confirm: bool = True) -> int:
        """Replicas the next batch on ``conn`` must reach (``RedisOptions.wait_replicas``;
        auto: one if the master had a connected replica when we last looked).

        Every ``replica_check_interval_s`` per server, whenever the master changes and after
        a WAIT fell short, the store also asks the deployment whether this server is still
        its master: a demoted or partitioned old master accepts writes until it is told, so
        a stale one raises NotSent (nothing sent) and the next attempt finds the new one."""
        address = _address(conn)
        known = self._replicas.get(address)
        now = self._clock.monotonic_s()
        topology = self._topology
        if confirm and topology is not None and not await topology.is_master(address):
            log.warning("redis_master_moved", stale=_shown(address))
            self._replicas.pop(address, None)
            await conn.disconnect()
            await topology.lost()
            raise NotSent() from StoreUnavailable(f"{_shown(address)} is no longer the master")
        wanted = self._options.wait_replicas
        if wanted == WAIT_AUTO:
            await conn.send_command("INFO", "replication", check_health=False)
            try:
                info = await conn.read_response()
            except redis_errors.ResponseError:
                info = b""  # INFO renamed away (managed Redis): cannot tell, do not wait
            wanted = 1 if _connected_replicas(info) > 0 else 0
            if known is None or known[0] != wanted:
                log.info("redis_wait_replicas", master=_shown(address), wait_for=wanted)
        self._replicas[address] = (wanted, now)
        return wanted


def _address(conn: Any) -> object:
    """Which server a connection reaches (host and port, or a Unix socket path)."""
    path = getattr(conn, "path", None)
    return path if path else (getattr(conn, "host", None), getattr(conn, "port", None))


def _shown(address: object) -> str:
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return str(address)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _connected_replicas(info: Any) -> int:
    for line in _text(info).splitlines():
        if line.startswith("connected_slaves:"):
            try:
                return int(line.split(":", 1)[1])
            except ValueError:
                return 0
    return 0


def out_of_memory(err: redis_errors.ResponseError) -> bool:
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
