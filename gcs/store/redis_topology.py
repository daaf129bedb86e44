"""Where the Redis master is, and how the store follows it when it moves.

One storage URL can name three shapes; :func:`connect` tells them apart as Ray 2.60 does
(``redis_context.cc``: an ``INFO`` probe, then ``SENTINEL MASTERS`` or the cluster path):

* ``redis://``, ``rediss://``, ``unix://`` answered by a plain server → :class:`Standalone`
  (one client, exactly as before; the ordinary path costs nothing extra);
* the same URL answered by a **sentinel** (``redis_mode:sentinel``) → :class:`Sentinels`:
  the sentinel must monitor exactly one master (Ray's rule), its peers are learned from it,
  and every new connection asks them where the master is now;
* ``redis+sentinel://[user:pass@]h1:26379,h2:26379/<master-name>[/<db>]`` (``rediss+``
  for TLS) → :class:`Sentinels` over that list;
* a **Redis Cluster** node (``redis_mode:cluster``) → ``gcs.store.redis_cluster.Cluster``:
  all our keys share one hash slot, so the store talks to the one master serving it and
  follows ``MOVED`` / ``ASK`` and failovers.

A topology hands out a ``Redis`` client for the current master (:attr:`Topology.client`);
the store reports what went wrong (:meth:`Topology.redirected`, :meth:`Topology.lost`) and
asks again.  Credentials: the URL's, else ``RedisOptions.username`` / ``password`` (Ray's
``--redis_username`` / ``--redis_password``), sent to sentinels too, as Ray does.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import structlog
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, ConnectionPool, SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)
from redis.backoff import ExponentialBackoff, NoBackoff

from gcs.store.redis_options import RedisOptions

__all__ = [
    "SENTINEL_SCHEMES",
    "Sentinels",
    "Standalone",
    "Topology",
    "TopologyError",
    "connect",
    "parse_sentinel_url",
]

log = structlog.get_logger("gcs.store.redis")

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379


class TopologyError(ValueError):
    """The URL or what answers at it cannot be used (the message says why and what to do)."""


class Topology(abc.ABC):
    """The current master of one Redis deployment."""

    mode: ClassVar[str]

    def key_prefix(self, namespace: str) -> bytes:
        """Prefix of every key of ``namespace``: Ray's ``RAY<namespace>@``."""
        return b"RAY" + namespace.encode() + b"@"

    async def bind(self, prefix: bytes) -> None:
        """Get ready to serve keys starting with ``prefix`` (Redis Cluster: find the master
        of their slot)."""
        return None

    @property
    @abc.abstractmethod
    def client(self) -> Redis:
        """A client for the master as far as we know now."""

    async def redirected(self, err: redis_errors.ResponseError) -> tuple[Redis, bool] | None:
        """A ``MOVED`` / ``ASK`` reply to a command: the client to send it to next and
        whether it must be preceded by ``ASKING``; None when this topology has no redirects."""
        return None

    async def lost(self) -> None:
        """The master stopped answering: look again where it is (best effort, no raise)."""
        return None

    async def is_master(self, address: object) -> bool:
        """Whether the server at ``address`` (host, port) is still the master as the
        deployment sees it (a demoted or partitioned old master keeps accepting writes until
        it is told; the store asks now and then).  True when nobody can say otherwise."""
        return True

    @abc.abstractmethod
    async def aclose(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode}


class Standalone(Topology):
    """One Redis server: the URL's."""

    mode = "standalone"

    def __init__(self, client: Redis) -> None:
        self._client = client

    @property
    def client(self) -> Redis:
        return self._client

    async def aclose(self) -> None:
        await self._client.aclose()


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
        raise TopologyError(f"{_redact(url)}: no sentinel address (h1:26379,h2:26379,...)")
    parts = [unquote(p) for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise TopologyError(
            f"{_redact(url)}: expected /<master-name>[/<db>] after the sentinel addresses"
        )
    db = 0
    if len(parts) == 2:
        try:
            db = int(parts[1])
        except ValueError:
            raise TopologyError(
                f"{_redact(url)}: database {parts[1]!r} is not an integer"
            ) from None
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
        raise TopologyError(f"{_redact(url)}: bad sentinel address {part!r}") from None
    if not parsed.hostname:
        raise TopologyError(f"{_redact(url)}: bad sentinel address {part!r}")
    return parsed.hostname, port


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    userinfo, at, tail = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{tail}"


# -- connecting --------------------------------------------------------------------------------


def connection_kwargs(options: RedisOptions) -> dict[str, Any]:
    """Socket, retry and health settings shared by every client the store builds."""
    return {
        "socket_timeout": options.socket_timeout_s,
        "socket_connect_timeout": options.connect_timeout_s,
        "retry": Retry(
            ExponentialBackoff(cap=options.backoff_cap_s, base=options.backoff_base_s),
            options.retries,
        ),
        "retry_on_error": [redis_errors.ConnectionError, redis_errors.TimeoutError],
        "health_check_interval": options.health_check_interval_s,
        "decode_responses": False,
    }


def _credentials(username: str, password: str, options: RedisOptions) -> dict[str, Any]:
    if password:
        return {"username": username or None, "password": password}
    if options.password:
        return {"username": options.username or None, "password": options.password}
    return {}


async def connect(url: str, options: RedisOptions) -> Topology:
    """The topology behind ``url``, probed like Ray (raises redis errors or TopologyError)."""
    scheme = url.split("://", 1)[0].lower()
    if scheme in SENTINEL_SCHEMES:
        parsed = parse_sentinel_url(url)
        creds = _credentials(parsed.username, parsed.password, options)
        return _sentinels(parsed.sentinels, parsed.service, parsed.db, parsed.ssl, creds, options)
    url_kwargs: dict[str, Any] = dict(parse_url(url))
    creds = {} if "password" in url_kwargs else _credentials("", "", options)
    probe = _probe_client(url_kwargs, creds, options)
    try:
        mode = await _redis_mode(probe)
        if mode == "sentinel":
            service, peers = await _monitored_master(probe, url)
            host = str(url_kwargs.get("host", "localhost"))
            port = int(url_kwargs.get("port", DEFAULT_SENTINEL_PORT))
            sentinels = [(host, port), *[p for p in peers if p != (host, port)]]
            ssl = url_kwargs.get("connection_class") is SSLConnection
            db = int(url_kwargs.get("db", 0))
            url_creds: dict[str, Any] = {
                k: url_kwargs[k] for k in ("username", "password") if k in url_kwargs
            }
            return _sentinels(sentinels, service, db, ssl, url_creds or creds, options)
        if mode == "cluster":
            from gcs.store.redis_cluster import Cluster

            if int(url_kwargs.get("db", 0)) != 0:
                raise TopologyError(
                    f"{_redact(url)}: a Redis Cluster has only database 0; use /0 in the URL"
                )
            seed = (str(url_kwargs.get("host", "localhost")), int(url_kwargs.get("port", 6379)))
            node_kwargs = {k: v for k, v in url_kwargs.items() if k not in {"host", "port", "db"}}
            return Cluster(seed, {**node_kwargs, **creds}, options)
    finally:
        with contextlib.suppress(redis_errors.RedisError, OSError):
            await probe.aclose()
    return Standalone(Redis.from_url(url, **creds, **connection_kwargs(options)))


def _probe_client(
    url_kwargs: dict[str, Any], creds: dict[str, Any], options: RedisOptions
) -> Redis:
    """A client of the URL's address on database 0 (a sentinel refuses SELECT)."""
    kwargs = {k: v for k, v in url_kwargs.items() if k != "db"}
    return Redis.from_pool(ConnectionPool(**{**connection_kwargs(options), **kwargs, **creds}))


async def _redis_mode(client: Redis) -> str:
    """``redis_mode`` of ``INFO server``: standalone, sentinel or cluster.  A server that
    refuses INFO (renamed on some managed services) is taken as standalone."""
    try:
        info = await client.info("server")
    except redis_errors.ResponseError:
        return "standalone"
    return str(info.get("redis_mode", "standalone"))


async def _monitored_master(client: Redis, url: str) -> tuple[str, list[tuple[str, int]]]:
    """The one master a sentinel monitors (Ray requires exactly one) and its peer sentinels."""
    masters = await client.execute_command("SENTINEL MASTERS")
    names = sorted(str(name) for name in masters)
    if len(names) != 1:
        listed = ", ".join(names) or "none"
        raise TopologyError(
            f"{_redact(url)} is a sentinel monitoring {len(names)} masters ({listed}); Ray "
            "needs exactly one: name it with redis+sentinel://HOST:PORT/<master-name>/<db>"
        )
    peers: list[tuple[str, int]] = []
    with contextlib.suppress(redis_errors.ResponseError):
        for peer in await client.execute_command("SENTINEL SENTINELS", names[0]):
            peers.append((str(peer["ip"]), int(peer["port"])))
    return names[0], peers


def _sentinels(
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
