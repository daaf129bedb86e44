"""URL -> :class:`~gcs.store.redis.topology.Topology`, probed as Ray 2.60 probes
(``redis_context.cc``: an ``INFO`` probe, then ``SENTINEL MASTERS`` or the cluster path).

The one module that knows every deployment: it imports the standalone, sentinel and
cluster topologies; none of them imports it."""

from __future__ import annotations

import contextlib
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.connection import ConnectionPool, SSLConnection, parse_url

from gcs.store.redis.cluster import Cluster
from gcs.store.redis.options import RedisOptions
from gcs.store.redis.sentinel import (
    DEFAULT_SENTINEL_PORT,
    SENTINEL_SCHEMES,
    parse_sentinel_url,
    sentinel_topology,
)
from gcs.store.redis.topology import (
    Standalone,
    Topology,
    TopologyError,
    connection_kwargs,
    redact,
)

__all__ = ["connect"]


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
        return sentinel_topology(
            parsed.sentinels, parsed.service, parsed.db, parsed.ssl, creds, options
        )
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
            return sentinel_topology(sentinels, service, db, ssl, url_creds or creds, options)
        if mode == "cluster":
            if int(url_kwargs.get("db", 0)) != 0:
                raise TopologyError(
                    f"{redact(url)}: a Redis Cluster has only database 0; use /0 in the URL"
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
            f"{redact(url)} is a sentinel monitoring {len(names)} masters ({listed}); Ray "
            "needs exactly one: name it with redis+sentinel://HOST:PORT/<master-name>/<db>"
        )
    peers: list[tuple[str, int]] = []
    with contextlib.suppress(redis_errors.ResponseError):
        for peer in await client.execute_command("SENTINEL SENTINELS", names[0]):
            peers.append((str(peer["ip"]), int(peer["port"])))
    return names[0], peers
