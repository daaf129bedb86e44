"""Redis Sentinel: a master whose address the sentinels give (``redis+sentinel://`` URLs,
or a plain URL answered by a sentinel; :mod:`gcs.store.redis.connect` tells them apart)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import structlog
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)
from redis.backoff import NoBackoff

from gcs.store.redis.options import RedisOptions
from gcs.store.redis.topology import Topology, TopologyError, connection_kwargs, redact

__all__ = [
    "DEFAULT_SENTINEL_PORT",
    "SENTINEL_SCHEMES",
    "SentinelUrl",
    "Sentinels",
    "parse_sentinel_url",
    "sentinel_topology",
]

log = structlog.get_logger("gcs.store.redis")

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379


class _MasterConnection(SentinelManagedConnection):
    """A sentinel-managed master connection that keeps a ``READONLY`` reply a ``READONLY``
    reply (redis-py turns it into a ConnectionError, which would make a refused write look
    as if it may have landed); it still drops the connection so the next one asks the
    sentinels where the master went."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await Connection.read_response(self, *args, **kwargs)
        except redis_errors.ReadOnlyError:
            await self.disconnect()
            raise


class _MasterSSLConnection(_MasterConnection, SSLConnection):
    pass


class _MasterPool(SentinelConnectionPool):
    """Drops a connection handed back while the sentinels name another master, so no
    command goes to an old master once anyone here noticed the move."""

    async def release(self, connection: Connection) -> None:  # type: ignore[override]
        stale = self.master_address is not None and self.master_address != (
            connection.host,
            connection.port,
        )
        if stale:
            await connection.disconnect()
        await super().release(connection)


class _Sentinel(Sentinel):
    """``discover_master`` that moves on past any failing sentinel (a wrong password is a
    failure too) and names each failure in one short line."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        failures: list[str] = []
        for index, sentinel in enumerate(self.sentinels):
            kwargs = sentinel.connection_pool.connection_kwargs
            where = f"{kwargs.get('host')}:{kwargs.get('port')}"
            try:
                masters = await sentinel.sentinel_masters()
            except (redis_errors.RedisError, OSError) as err:
                failures.append(f"{where}: {type(err).__name__}: {err}")
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):
                self.sentinels[0], self.sentinels[index] = sentinel, self.sentinels[0]
                return str(state["ip"]), int(state["port"])
            failures.append(f"{where}: no healthy master {service_name!r}")
        raise MasterNotFoundError(
            f"no sentinel names a master {service_name!r} ({'; '.join(failures)})"
        )


class Sentinels(Topology):
    """A master monitored by Redis Sentinel: every new connection asks the sentinels for its
    address (``redis.asyncio.sentinel``), so after a failover the next connection reaches the
    new master; connections to the old one fail or answer READONLY and are dropped."""

    mode = "sentinel"

    def __init__(
        self,
        sentinels: list[tuple[str, int]],
        service: str,
        *,
        db: int,
        ssl: bool,
        master_kwargs: dict[str, Any],
        sentinel_kwargs: dict[str, Any],
    ) -> None:
        self.sentinels = sentinels
        self.service = service
        self._sentinel = _Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs)
        self._client: Redis = self._sentinel.master_for(
            service,
            connection_pool_class=_MasterPool,
            connection_class=_MasterSSLConnection if ssl else _MasterConnection,
            db=db,
            **master_kwargs,
        )

    @property
    def client(self) -> Redis:
        return self._client

    async def lost(self) -> None:
        # Ask the sentinels now: when the master moved, the pool drops its idle connections
        # to the old one (new connections ask on their own).
        pool = self._client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        with contextlib.suppress(redis_errors.RedisError, OSError):
            await pool.get_master_address()

    async def is_master(self, address: object) -> bool:
        try:
            host, port = await self._sentinel.discover_master(self.service)
        except (redis_errors.RedisError, OSError) as err:
            log.warning("redis_sentinels_silent", master_name=self.service, error=str(err))
            return True  # no sentinel answers: none can have promoted another node either
        return address == (host, port)

    async def aclose(self) -> None:
        with contextlib.suppress(redis_errors.RedisError, OSError):
            await self._client.aclose()
        with contextlib.suppress(redis_errors.RedisError, OSError):
            await self._sentinel.aclose()

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "master_name": self.service,
            "sentinels": [f"{h}:{p}" for h, p in self.sentinels],
        }


# -- URLs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    """``redis+sentinel://[user:pass@]h1:p1,h2:p2/<master-name>[/<db>]``."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int
    ssl: bool
    username: str
    password: str


def parse_sentinel_url(url: str) -> SentinelUrl:
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts = netloc
    username, _, password = userinfo.partition(":") if at else ("", "", "")
    sentinels = [_host_port(part, url) for part in hosts.split(",") if part]
    if not sentinels:
        raise TopologyError(f"{redact(url)}: no sentinel address (h1:26379,h2:26379,...)")
    parts = [unquote(p) for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise TopologyError(
            f"{redact(url)}: expected /<master-name>[/<db>] after the sentinel addresses"
        )
    db = 0
    if len(parts) == 2:
        try:
            db = int(parts[1])
        except ValueError:
            raise TopologyError(f"{redact(url)}: database {parts[1]!r} is not an integer") from None
    return SentinelUrl(
        sentinels=sentinels,
        service=parts[0],
        db=db,
        ssl=scheme.lower() == "rediss+sentinel",
        username=unquote(username),
        password=unquote(password),
    )


def _host_port(part: str, url: str) -> tuple[str, int]:
    parsed = urlsplit(f"//{part}")
    try:
        port = parsed.port or DEFAULT_SENTINEL_PORT
    except ValueError:
        raise TopologyError(f"{redact(url)}: bad sentinel address {part!r}") from None
    if not parsed.hostname:
        raise TopologyError(f"{redact(url)}: bad sentinel address {part!r}")
    return parsed.hostname, port


def sentinel_topology(
    sentinels: list[tuple[str, int]],
    service: str,
    db: int,
    ssl: bool,
    creds: dict[str, Any],
    options: RedisOptions,
) -> Sentinels:
    base = connection_kwargs(options)
    sentinel_kwargs = {
        "socket_timeout": options.socket_timeout_s,
        "socket_connect_timeout": options.connect_timeout_s,
        # one try per sentinel per look-up: the list is the redundancy, the store retries
        "retry": Retry(NoBackoff(), 0),
        **creds,
    }
    if ssl:
        sentinel_kwargs["ssl"] = True
    return Sentinels(
        sentinels,
        service,
        db=db,
        ssl=ssl,
        master_kwargs={**base, **creds},
        sentinel_kwargs=sentinel_kwargs,
    )
