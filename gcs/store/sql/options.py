"""Tuning of the SQL store (:class:`SqlOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = ["SqlOptions"]


@dataclass(frozen=True, slots=True)
class SqlOptions:
    """Connection tuning; defaults suit a GCS next to its database."""

    connect_timeout_s: float = 5.0
    """Give up connecting (PostgreSQL) after this long → StoreUnavailable."""
    command_timeout_s: float = 10.0
    """Give up on one statement (PostgreSQL) after this long → StoreUnavailable."""
    busy_timeout_s: float = 5.0
    """SQLite: wait this long for another process's write lock → StoreUnavailable."""
    pool_size: int = 5
    """Connections kept open (PostgreSQL)."""
    write_id_retention_s: float = 900.0
    """How long ``landed()`` can answer for a write id (rows pruned after this)."""
    prune_every: int = 512
    """Prune expired write ids in every n-th write transaction."""
    resolve_attempts: int = 3
    """After an ambiguous commit, ask ``landed()`` this many times before giving up."""
    resolve_backoff_s: float = 0.2
    """Wait between those attempts (doubling)."""
    changes_max_entries: int = 100_000
    """HA: batches the change stream keeps (a standby further behind reloads)."""
    changes_max_age_s: float = 3600.0
    """HA: batches older than this are trimmed too."""
    changes_trim_every: int = 256
    """HA: trim the change stream in every n-th batch's transaction."""
    changes_poll_interval_s: float = 0.05
    """HA: how often a blocked ``read_changes`` looks again when it cannot be notified
    (SQLite, or PostgreSQL while its LISTEN connection is down)."""

    default: ClassVar[SqlOptions]


SqlOptions.default = SqlOptions()
