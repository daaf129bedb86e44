"""A standby's warm copy of the store, and the store a new leader loads from.

:class:`TableMirror` holds the tables the managers load at start (``load()`` of each
component), kept current by following the store's change stream
(:meth:`gcs.store.ha.HaStore.read_changes`): at a takeover the components load from memory
instead of reading every table from Redis / PostgreSQL.  Tables read on demand (KV) and the
autoscaler's are not copied: they are read from the store itself.

The node table is also kept parsed, and each node row's *prepared views* (:data:`PREPARED`:
the resource cache's entry, the health checker's record, the virtual clusters' node view)
are built as the row arrives, so a takeover's load adopts per-node state instead of
building it for 10,000 nodes while no GCS answers (:meth:`gcs.store.Store.prepared`).

:class:`TakeoverStore` is the store one leader term's managers get: while they load, reads
of the mirrored tables come from the mirror (and the term's own writes are applied to it,
so a later component's load sees an earlier one's repairs); once every component loaded,
:meth:`TakeoverStore.release_mirror` drops the copy and every read goes to the store.
Writes always go to the store, fenced; a :class:`StoreFenced` refusal tells the coordinator
at once (``on_fenced``) before it is raised to the writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from gcs.managers.actors import TABLE_ACTOR, TABLE_ACTOR_TASK_SPEC
from gcs.managers.health import node_health
from gcs.managers.resources import node_entry
from gcs.policy.virtual_clusters.convert import node_view_from_gcs_node_info
from gcs.proto import gcs_pb2
from gcs.server.ha_handover import NOTICE_KEY, TABLE_HA, HandoverNotice
from gcs.store import Store
from gcs.store.base import (
    TABLE_JOB,
    TABLE_META,
    TABLE_NODE,
    TABLE_PLACEMENT_GROUP,
    TABLE_VIRTUAL_CLUSTER,
    TABLE_WORKERS,
    WriteBatch,
)
from gcs.store.errors import StoreFenced
from gcs.store.ha import Change, ChangeCursor, HaStore

__all__ = ["MIRRORED_TABLES", "PREPARED", "TableMirror", "TakeoverStore"]

T = TypeVar("T")
View = Callable[[Any], Any]

MIRRORED_TABLES = (
    TABLE_META,
    TABLE_NODE,
    TABLE_PLACEMENT_GROUP,
    TABLE_JOB,
    TABLE_WORKERS,
    TABLE_VIRTUAL_CLUSTER,
    TABLE_ACTOR,
    TABLE_ACTOR_TASK_SPEC,
)
"""What the components' ``load()`` read whole (``get_all`` / ``get`` / ``scan_prefix``)."""

DECODED: Mapping[str, Callable[[bytes], Any]] = {TABLE_NODE: gcs_pb2.GcsNodeInfo.FromString}
"""Tables the mirror also keeps parsed as rows arrive (the node table: its load at a
takeover adopts the messages instead of parsing 10,000 rows; :meth:`Store.decoded_rows`)."""

PREPARED: Mapping[str, tuple[View, ...]] = {
    TABLE_NODE: (node_entry, node_health, node_view_from_gcs_node_info),
}
"""Views of a parsed row built as the row arrives (each a pure function of the row; a
mutable one is replaced, never changed, when its row changes), handed over at a takeover
by :meth:`TakeoverStore.prepared` to the load that would otherwise build it per node."""

FOLLOW_LIMIT = 10_000
"""Changes applied per read of the stream (whole batches)."""


class TableMirror:
    """The mirrored tables as of :attr:`cursor` in the change stream."""

    def __init__(
        self,
        tables: Iterable[str] = MIRRORED_TABLES,
        decoders: Mapping[str, Callable[[bytes], Any]] = DECODED,
        views: Mapping[str, tuple[View, ...]] = PREPARED,
    ) -> None:
        self.tables: dict[str, dict[bytes, bytes]] = {table: {} for table in tables}
        self._all_decoders = {t: d for t, d in decoders.items() if t in self.tables}
        self._decoders = dict(self._all_decoders)
        self._views = {t: v for t, v in views.items() if t in self._all_decoders}
        self.decoded: dict[str, dict[bytes, Any]] = {table: {} for table in self._decoders}
        """The rows of the ``decoders``' tables, parsed (same keys as ``tables``).  A row
        that does not parse drops its table from here until the next load: the term's load
        then reads the raw rows and fails (or repairs) as a cold start would."""
        self.prepared: dict[str, dict[View, dict[bytes, tuple[Any, Any]]]] = {}
        """Per decoded table, per view: ``(parsed row, its view)`` by key (the row is the
        object in ``decoded``; a view that raised has no entry: its reader builds it, and
        fails, as a cold start would)."""
        self._reset_prepared()
        self.cursor: ChangeCursor = b"0"
        self.notice: HandoverNotice | None = None
        """The last planned-handover notice seen in the stream (:mod:`.ha_handover`)."""
        self.notices = 0
        self.applied = 0
        """Changes applied since the last load (for logs and tests)."""

    @property
    def rows(self) -> int:
        return sum(len(rows) for rows in self.tables.values())

    async def load(self, store: HaStore) -> None:
        """Read every mirrored table; changes after the cursor taken *before* the reads
        are applied later (re-applying one already read is harmless: each carries its key's
        final value)."""
        assert isinstance(store, Store)
        cursor = await store.change_cursor()
        for table in self.tables:
            self.tables[table] = await store.get_all(table)
        self._decoders = dict(self._all_decoders)
        self.decoded = {}
        for table, decode in list(self._decoders.items()):
            try:
                self.decoded[table] = {k: decode(raw) for k, raw in self.tables[table].items()}
            except Exception:
                self._undecodable(table)
        self._reset_prepared()
        for table, views in self.prepared.items():
            for key, row in self.decoded[table].items():
                _build_views(views, key, row)
        self.cursor = cursor
        self.applied = 0

    def _reset_prepared(self) -> None:
        self.prepared = {
            table: {view: {} for view in self._views.get(table, ())} for table in self.decoded
        }

    def _set(self, table: str, rows: dict[bytes, bytes], key: bytes, value: bytes | None) -> None:
        decoded = self.decoded.get(table)
        if value is None:
            rows.pop(key, None)
            if decoded is not None:
                decoded.pop(key, None)
                for built in self.prepared[table].values():
                    built.pop(key, None)
            return
        rows[key] = value
        if decoded is None:
            return
        try:
            row = decoded[key] = self._decoders[table](value)
        except Exception:
            self._undecodable(table)
            return
        _build_views(self.prepared[table], key, row)

    def _undecodable(self, table: str) -> None:
        self._decoders.pop(table, None)
        self.decoded.pop(table, None)
        self.prepared.pop(table, None)

    def apply(self, changes: Iterable[Change]) -> None:
        tables = self.tables
        for change in changes:
            rows = tables.get(change.table)
            if rows is None:
                if change.table == TABLE_HA and change.key == NOTICE_KEY:
                    self.notice = HandoverNotice.decode(change.value)
                    self.notices += 1
                continue  # not mirrored (KV, counters, the autoscaler's instances)
            self._set(change.table, rows, change.key, change.value)
            self.applied += 1

    def apply_batch(self, batch: WriteBatch) -> None:
        """A write this process made itself (conditions already held in the store)."""
        tables = self.tables
        for table, key, value in batch.puts:
            rows = tables.get(table)
            if rows is not None:
                self._set(table, rows, key, value)
        for table, key in batch.deletes:
            rows = tables.get(table)
            if rows is not None:
                self._set(table, rows, key, None)

    async def follow(self, store: HaStore, *, block_ms: int = 0) -> int:
        """Apply the next changes (waiting up to ``block_ms`` for some); how many.  Raises
        ChangesTrimmed when the stream no longer holds what follows the cursor (reload)."""
        cursor, changes = await store.read_changes(
            self.cursor, block_ms=block_ms, limit=FOLLOW_LIMIT
        )
        self.apply(changes)
        self.cursor = cursor
        return len(changes)

    async def drain(self, store: HaStore) -> int:
        """Apply every change written so far (after a takeover's fence nothing else lands)."""
        total = 0
        while applied := await self.follow(store):
            total += applied
        return total


class TakeoverStore(Store):
    """One leader term's store (see the module docstring)."""

    def __init__(
        self, store: Store, mirror: TableMirror | None, *, on_fenced: Callable[[], None]
    ) -> None:
        self._store = store
        self._mirror = mirror
        self._on_fenced = on_fenced
        self.url = store.url

    @property
    def backend(self) -> Store:
        return self._store

    def release_mirror(self) -> None:
        """Every component loaded: from now on reads go to the store."""
        self._mirror = None

    def _rows(self, table: str) -> dict[bytes, bytes] | None:
        mirror = self._mirror
        return mirror.tables.get(table) if mirror is not None else None

    async def open(self) -> None:
        await self._store.open()  # idempotent: the coordinator opened it

    async def close(self) -> None:
        return None  # the coordinator's, across terms

    async def get(self, table: str, key: bytes) -> bytes | None:
        rows = self._rows(table)
        if rows is None:
            return await self._store.get(table, key)
        return rows.get(key)

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        rows = self._rows(table)
        if rows is None:
            return await self._store.multi_get(table, keys)
        return {key: rows[key] for key in keys if key in rows}

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        rows = self._rows(table)
        if rows is None:
            return await self._store.get_all(table)
        return dict(rows)

    def decoded_rows(self, table: str) -> Mapping[bytes, Any] | None:
        """The mirror's parsed rows, handed over (no copy: the mirror is dropped once every
        component loaded, and a reader's load is the only one of that table)."""
        mirror = self._mirror
        return mirror.decoded.get(table) if mirror is not None else None

    def prepared(
        self, table: str, view: Callable[[Any], T], rows: Iterable[tuple[bytes, Any]]
    ) -> dict[bytes, T]:
        """The mirror's view of each row, handed over once (popped) if it was built from that
        very row object; else built here (a row the term wrote since, a view the mirror
        does not keep, the mirror released)."""
        mirror = self._mirror
        built = mirror.prepared.get(table, {}).get(view) if mirror is not None else None
        if built is None:
            return super().prepared(table, view, rows)
        take = built.pop
        return {
            key: made[1] if (made := take(key, None)) is not None and made[0] is row else view(row)
            for key, row in rows
        }

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        rows = self._rows(table)
        if rows is None:
            return await self._store.scan_prefix(table, prefix)
        return {key: value for key, value in rows.items() if key.startswith(prefix)}

    async def scan_keys(self, table: str, prefix: bytes, *, max_bytes: int) -> list[bytes] | None:
        if self._rows(table) is None:
            return await self._store.scan_keys(table, prefix, max_bytes=max_bytes)
        return await super().scan_keys(table, prefix, max_bytes=max_bytes)

    async def write(self, batch: WriteBatch) -> None:
        try:
            await self._store.write(batch)
        except StoreFenced:
            self._on_fenced()
            raise
        mirror = self._mirror
        if mirror is not None:
            mirror.apply_batch(batch)

    async def landed(self, write_id: bytes) -> bool:
        return await self._store.landed(write_id)

    async def increment(self, counter: str, by: int = 1) -> int:
        try:
            return await self._store.increment(counter, by)
        except StoreFenced:
            self._on_fenced()
            raise

    async def read_counter(self, counter: str) -> int:
        return await self._store.read_counter(counter)


def _build_views(views: dict[View, dict[bytes, tuple[Any, Any]]], key: bytes, row: Any) -> None:
    for view, built in views.items():
        try:
            built[key] = (row, view(row))
        except Exception:
            built.pop(key, None)
