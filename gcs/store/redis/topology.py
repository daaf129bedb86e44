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
* a **Redis Cluster** node (``redis_mode:cluster``) → ``gcs.store.redis.cluster.Cluster``:
  all our keys share one hash slot, so the store talks to the one master serving it and
  follows ``MOVED`` / ``ASK`` and failovers.

A topology hands out a ``Redis`` client for the current master (:attr:`Topology.client`);
the store reports what went wrong (:meth:`Topology.redirected`, :meth:`Topology.lost`) and
asks again.  Credentials: the URL's, else ``RedisOptions.username`` / ``password`` (Ray's
``--redis_username`` / ``--redis_password``), sent to sentinels too, as Ray does.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from gcs.store.redis.options import RedisOptions

__all__ = [
    "Standalone",
    "Topology",
    "TopologyError",
    "connection_kwargs",
    "redact",
]


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


def redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    userinfo, at, tail = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{tail}"
