"""The store's format version: which GCS versions can read what is stored (issue 29).

One record, ``GCS_META`` / :data:`FORMAT_KEY` (JSON ``{"version", "min_reader"}``): the store
is written in format ``version`` and a member must know at least ``min_reader`` to read it.
It is a row like any other, so it travels the HA change stream: a standby sees it at its
load and whenever it changes.

Changes of format are online, in two steps (expand, then contract):

* **expand** -- a leader of a newer version writes only what the older versions still read
  (new tables or keys they ignore, never a changed meaning of an old row) and raises
  ``version`` but not ``min_reader`` (:func:`expanded`): older members keep following the
  store and can take over again;
* **contract** -- once no older member is left, the operator raises ``min_reader``
  (``gcs ha finish-upgrade``, :func:`contracted`); from then on the newer version may drop
  what only the older ones needed, and an older member refuses to join (:func:`check`).

A store without the record is in format 1 (GCS versions from before it: they neither
write nor read it).  Every write of the record is a compare-and-set on its previous value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gcs.store.base import TABLE_META, Store, WriteBatch

__all__ = [
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "StoreFormat",
    "StoreTooNew",
    "check",
    "contracted",
    "expanded",
    "read_format",
    "write_format",
]

FORMAT_KEY = b"store/format"
FORMAT_VERSION = 2
"""This version's format.  1: before the record.  2: + table ``GCS_HA`` (the HA group's
handover notices; format 1 ignores the table, so 2 is read by 1: ``min_reader`` stays 1)."""
OLDEST_READER = 1
"""The oldest format whose members read what this version writes (the expand phase)."""


class StoreTooNew(Exception):
    """The store's format needs a newer GCS than this one (it must not join)."""


@dataclass(frozen=True, slots=True)
class StoreFormat:
    version: int
    min_reader: int

    def encode(self) -> bytes:
        return json.dumps({"version": self.version, "min_reader": self.min_reader}).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> StoreFormat:
        if raw is None:
            return cls(1, 1)
        try:
            data = json.loads(raw)
            return cls(int(data["version"]), int(data["min_reader"]))
        except (ValueError, KeyError, TypeError) as err:
            raise StoreTooNew(
                f"the store's format record ({TABLE_META}/{FORMAT_KEY.decode()}) is not one "
                f"this GCS (format {FORMAT_VERSION}) can read: {raw[:100]!r}"
            ) from err


def check(found: StoreFormat, known: int = FORMAT_VERSION) -> None:
    """Raise :class:`StoreTooNew` unless a member of format ``known`` can read the store."""
    if found.min_reader > known:
        raise StoreTooNew(
            f"the store is in format {found.version}, readable by GCS format "
            f"{found.min_reader} and newer; this GCS knows format {known}: upgrade it "
            "(docs/operations.md, Upgrading)"
        )


def expanded(found: StoreFormat, known: int = FORMAT_VERSION) -> StoreFormat | None:
    """The record a leader of format ``known`` writes at its term's start (None: as is)."""
    if found.version >= known:
        return None
    return StoreFormat(known, max(found.min_reader, min(OLDEST_READER, known)))


def contracted(found: StoreFormat, known: int = FORMAT_VERSION) -> StoreFormat | None:
    """The record once no member older than ``known`` is left (None: already so)."""
    if found.version >= known and found.min_reader >= known:
        return None
    return StoreFormat(max(found.version, known), max(found.min_reader, known))


async def read_format(store: Store) -> tuple[StoreFormat, bytes | None]:
    """The store's format, and the record as stored (for :func:`write_format`)."""
    raw = await store.get(TABLE_META, FORMAT_KEY)
    return StoreFormat.decode(raw), raw


async def write_format(store: Store, new: StoreFormat, previous: bytes | None) -> None:
    """Compare-and-set: raises ``StoreConflict`` if the record changed since ``previous``."""
    batch = WriteBatch().expect(TABLE_META, FORMAT_KEY, previous)
    await store.write(batch.put(TABLE_META, FORMAT_KEY, new.encode()))
