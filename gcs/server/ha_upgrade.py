"""Rolling upgrades of an HA group (issue 29): the store's format (:mod:`gcs.store.format`)
checked by every member as it follows the store, expanded by each new leader.

* A standby checks the format at each load of its mirror and after each read of the change
  stream (the record is a mirrored row): a store that needs a newer GCS makes it stop
  with :class:`~gcs.store.format.StoreTooNew` (``gcs serve`` prints one line, exits 1).
* A leader, once fenced and drained, raises the format to its own version without raising
  the oldest reader (the expand step); ``gcs ha finish-upgrade`` contracts.
"""

from __future__ import annotations

import structlog

from gcs.server.ha_mirror import TableMirror
from gcs.store import Store
from gcs.store.base import TABLE_META
from gcs.store.errors import StoreError
from gcs.store.format import FORMAT_KEY, StoreFormat, check, expanded, write_format

__all__ = ["check_mirror", "expand_format"]

log = structlog.get_logger("gcs.ha")


def check_mirror(mirror: TableMirror) -> StoreFormat:
    """The format the mirror holds; raises ``StoreTooNew`` if this GCS cannot read it."""
    found = StoreFormat.decode(mirror.tables[TABLE_META].get(FORMAT_KEY))
    check(found)
    return found


async def expand_format(store: Store, mirror: TableMirror) -> None:
    """A new leader's expand step (its store fenced: an ex-leader writes nothing).  A
    failure is logged, not raised: the next leader tries again, and an older format is
    still read by this version."""
    raw = mirror.tables[TABLE_META].get(FORMAT_KEY)
    found = StoreFormat.decode(raw)
    new = expanded(found)
    if new is None:
        return
    try:
        await write_format(store, new, raw)
    except StoreError as err:
        log.warning("ha.format_not_expanded", error=str(err))
        return
    log.info("ha.format_expanded", version=new.version, min_reader=new.min_reader)
