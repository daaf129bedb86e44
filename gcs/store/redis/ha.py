"""The Redis side of ``gcs.store.ha``: key names, and what the HA scripts' replies mean.

The scripts themselves are in ``gcs.store.redis.scripts`` (layout and atomicity there);
``RedisStore`` runs them.  This module has no I/O.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from redis import exceptions as redis_errors

from gcs.store.errors import StoreCorrupt
from gcs.store.ha import Change, ChangeCursor, LeaseInfo
from gcs.store.ha_parts import check_contiguous, decode_changes, whole_batches

__all__ = [
    "READ_COUNT",
    "HaKeys",
    "answered",
    "fenced_epoch",
    "parse_changes",
    "parse_lease",
]

READ_COUNT = 1000
"""Stream entries (batches) one read asks for at most."""


class HaKeys(NamedTuple):
    """The keys of one namespace's HA state (all under the store's prefix, so in a Redis
    Cluster they share the slot of its tables)."""

    state: bytes
    """Hash: ``epoch`` (last granted, never expires), ``holder``, ``seq`` (last batch)."""
    lease: bytes
    """String: the live lease's epoch, with ``PX`` = the lease's TTL."""
    changes: bytes
    """Stream: one entry ``<seq>-0`` per applied batch, field ``b`` = its changes."""

    @classmethod
    def of(cls, prefix: bytes) -> HaKeys:
        return cls(prefix + b"__gcs_ha", prefix + b"__gcs_lease", prefix + b"__gcs_changes")


def fenced_epoch(err: redis_errors.ResponseError) -> int:
    """The current epoch named by a ``GCSFENCED <epoch>`` reply."""
    try:
        return int(str(err).split()[1])
    except (IndexError, ValueError):
        return 0


def parse_lease(reply: Any) -> LeaseInfo | None:
    """``READ_LEASE``'s reply: ``{epoch, holder, remaining ms}`` or nil."""
    if not reply:
        return None
    epoch, holder, remaining_ms = reply
    if epoch is None or holder is None:
        raise StoreCorrupt("a live Redis lease without its epoch / holder in the HA hash")
    return LeaseInfo(_text(holder), int(epoch), int(remaining_ms))


def answered(reply: Any, after: int) -> bool:
    """Whether a ``READ_CHANGES`` reply read after ``after`` is worth returning: it holds
    entries, or batches after ``after`` exist and are gone (ChangesTrimmed is due)."""
    last, entries = reply
    return bool(entries) or int(last) != after


def parse_changes(
    reply: Any, after: int, limit: int, where: str
) -> tuple[ChangeCursor, list[Change]]:
    """``READ_CHANGES``'s reply ``{last seq, [[id, [field, value...]]...]}`` read after
    ``after``: whole batches up to ``limit`` changes (ChangesTrimmed if some are gone)."""
    last, entries = reply
    batches: list[tuple[int, list[Change]]] = []
    try:
        for entry_id, fields in entries:
            seq = int(bytes(entry_id).split(b"-", 1)[0])
            blob = dict(zip(fields[::2], fields[1::2], strict=True))[b"b"]
            batches.append((seq, decode_changes(bytes(blob))))
    except (KeyError, ValueError) as err:
        raise StoreCorrupt(f"{where}: change stream entry not written by gcs: {err}") from err
    check_contiguous(after, int(last), batches[0][0] if batches else None)
    return whole_batches(batches, after, limit)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
