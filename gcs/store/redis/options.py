"""Tuning of the Redis backend (no import of redis-py: config code reads it too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = ["WAIT_AUTO", "RedisOptions"]

WAIT_AUTO = -1
"""``RedisOptions.wait_replicas``: wait for one replica whenever the master has one."""


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
    username: str = ""
    """Redis ACL user (Ray's ``--redis_username``); a user in the URL wins."""
    password: str = ""
    """Redis password (Ray's ``--redis_password``); a password in the URL wins.  Sent to
    the sentinels too, as Ray does."""
    wait_replicas: int = WAIT_AUTO
    """Replicas that must acknowledge a write batch (Redis ``WAIT``) before it counts as
    written: ``-1`` (default) one whenever the master has a connected replica, ``0`` never,
    ``N`` always N.  A WAIT that falls short answers "may have been applied"."""
    wait_timeout_ms: int = 1000
    """How long one ``WAIT`` blocks for replica acknowledgements."""
    replica_check_interval_s: float = 5.0
    """``wait_replicas=-1``: how often the master's replica count is looked at again (also
    at once whenever the master changes or a WAIT falls short)."""

    changes_max_entries: int = 100_000
    """HA (``gcs serve --ha``): batches the change stream keeps (``XADD MAXLEN ~``, so a
    little more).  A standby that falls further behind reloads.  At ~500 batches/s (a
    10,000-node cluster registering, jobs and actors churning) that is a few minutes."""

    default: ClassVar[RedisOptions]

    def __post_init__(self) -> None:
        if self.wait_replicas < WAIT_AUTO:
            raise ValueError(f"wait_replicas must be >= -1 (auto), got {self.wait_replicas}")
        if self.wait_timeout_ms < 1:
            raise ValueError(f"wait_timeout_ms must be >= 1, got {self.wait_timeout_ms}")
        if self.changes_max_entries < 1:
            raise ValueError(f"changes_max_entries must be >= 1, got {self.changes_max_entries}")
        if self.username and not self.password:
            raise ValueError("a Redis username needs a password (Ray refuses it too)")


RedisOptions.default = RedisOptions()
