"""Workers (``ray.rpc.WorkerInfoGcsService``): the WORKERS table, as Ray's GCS keeps it.

Core workers and drivers add themselves when they start (``AddWorkerInfo``); raylets report
their exit (``ReportWorkerFailure``), which merges the exit fields into the stored record,
marks it dead and publishes a ``WorkerDeltaData`` {worker_id, node_id} on
``GCS_WORKER_DELTA_CHANNEL`` (key = worker id): owners of objects and actors on that worker
hear of its death there.  Every mutation runs on the manager's lane (validate -> persist ->
apply -> publish); reads use memory.

Bounded: all live workers are kept, and at most ``max_dead_cached`` dead ones (oldest
evicted from memory and the store first), so a long-running cluster whose workers come and
go does not grow the table without end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import structlog

from gcs.base.clock import Clock
from gcs.base.errors import InvalidArgument, NotFound
from gcs.base.ids import NODE_ID_SIZE
from gcs.managers.events import WorkerEvents
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.managers.nodes import Publish, no_publish
from gcs.proto import gcs_pb2, pubsub_pb2
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_WORKERS

log = structlog.get_logger("gcs.workers")

WORKER_ID_SIZE = NODE_ID_SIZE


def worker_id_of(data: gcs_pb2.WorkerTableData, field: str) -> bytes:
    worker_id = data.worker_address.worker_id
    if len(worker_id) != WORKER_ID_SIZE:
        raise InvalidArgument(
            f"{field}.worker_address.worker_id must be {WORKER_ID_SIZE} bytes, got {len(worker_id)}"
        )
    return worker_id


def require_worker_id(worker_id: bytes, field: str = "worker_id") -> bytes:
    if len(worker_id) != WORKER_ID_SIZE:
        raise InvalidArgument(f"{field} must be {WORKER_ID_SIZE} bytes, got {len(worker_id)}")
    return worker_id


class WorkerManager:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        publish: Publish = no_publish,
        worker_events: WorkerEvents | None = None,
        max_dead_cached: int = 1000,
        lane_policy: ResolvePolicy | None = None,
    ) -> None:
        self._store = store
        self._worker_events = worker_events if worker_events is not None else WorkerEvents()
        self._clock = clock
        self._publish = publish
        self._max_dead = max_dead_cached
        self._lane = ApplyLane(store, "workers", clock, policy=lane_policy)
        self._alive: dict[bytes, gcs_pb2.WorkerTableData] = {}
        self._dead: OrderedDict[bytes, gcs_pb2.WorkerTableData] = OrderedDict()
        self.alive: Mapping[bytes, gcs_pb2.WorkerTableData] = MappingProxyType(self._alive)
        """Live workers by id: a read-only live view."""
        self.dead: Mapping[bytes, gcs_pb2.WorkerTableData] = MappingProxyType(self._dead)
        """The bounded cache of dead workers, oldest first: a read-only live view."""
        self.failures_reported = 0

    async def load(self) -> None:
        rows = await self._store.get_all(TABLE_WORKERS)
        dead = []
        for worker_id, raw in rows.items():
            data = gcs_pb2.WorkerTableData.FromString(raw)
            if data.is_alive:
                self._alive[worker_id] = data
            else:
                dead.append((data.end_time_ms, worker_id, data))
        for _, worker_id, data in sorted(dead):
            self._dead[worker_id] = data
        log.info("workers.loaded", alive=len(self._alive), dead=len(self._dead))

    # -- queries -------------------------------------------------------------------------
    def get(self, worker_id: bytes) -> gcs_pb2.WorkerTableData | None:
        return self._alive.get(worker_id) or self._dead.get(worker_id)

    def all_workers(self) -> Iterable[gcs_pb2.WorkerTableData]:
        yield from self._alive.values()
        yield from self._dead.values()

    def total(self) -> int:
        return len(self._alive) + len(self._dead)

    # -- mutations -----------------------------------------------------------------------
    async def add(self, data: gcs_pb2.WorkerTableData) -> None:
        worker_id = worker_id_of(data, "worker_data")
        stored = gcs_pb2.WorkerTableData()
        stored.CopyFrom(data)
        async with self._lane:
            await self._put(worker_id, stored)

    async def report_failure(self, failure: gcs_pb2.WorkerTableData) -> None:
        """Ray's merge: the stored record (if any) overlaid with the report, then dead."""
        worker_id = worker_id_of(failure, "worker_failure")
        async with self._lane:
            merged = gcs_pb2.WorkerTableData()
            known = self.get(worker_id)
            if known is not None:
                merged.CopyFrom(known)
            merged.MergeFrom(failure)
            merged.is_alive = False
            delta = gcs_pb2.WorkerDeltaData(
                worker_id=worker_id, node_id=merged.worker_address.node_id
            )

            def published() -> None:
                self.failures_reported += 1
                self._publish(pubsub_pb2.GCS_WORKER_DELTA_CHANNEL, worker_id, delta)
                for listener in self._worker_events:
                    listener.on_worker_dead(merged)

            await self._put(worker_id, merged, after=published)

    async def update_debugger_port(self, worker_id: bytes, port: int) -> None:
        async with self._lane:
            updated = self._copy_of(worker_id)
            updated.debugger_port = port
            await self._put(worker_id, updated)

    async def update_paused_threads(self, worker_id: bytes, delta: int) -> None:
        async with self._lane:
            updated = self._copy_of(worker_id)
            updated.num_paused_threads = max(0, updated.num_paused_threads + delta)
            await self._put(worker_id, updated)

    def _copy_of(self, worker_id: bytes) -> gcs_pb2.WorkerTableData:
        known = self.get(worker_id)
        if known is None:
            raise NotFound(f"worker {worker_id.hex()} not found")
        updated = gcs_pb2.WorkerTableData()
        updated.CopyFrom(known)
        return updated

    async def _put(
        self,
        worker_id: bytes,
        data: gcs_pb2.WorkerTableData,
        after: Callable[[], None] | None = None,
    ) -> None:
        """Persist and apply one record (hold the lane); evicts the oldest dead workers."""
        batch = WriteBatch().put(TABLE_WORKERS, worker_id, data.SerializeToString())
        evicted: list[bytes] = []
        if not data.is_alive and worker_id not in self._dead:
            excess = len(self._dead) + 1 - self._max_dead
            evicted = list(self._dead)[: max(excess, 0)]
            for old in evicted:
                batch.delete(TABLE_WORKERS, old)

        def apply() -> None:
            for old in evicted:
                self._dead.pop(old, None)
            if data.is_alive:
                self._dead.pop(worker_id, None)
                self._alive[worker_id] = data
            else:
                self._alive.pop(worker_id, None)
                self._dead[worker_id] = data
            if after is not None:
                after()

        await self._lane.commit(batch, apply)
