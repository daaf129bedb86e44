"""Jobs (``ray.rpc.JobInfoGcsService``): the JOB table and the job id counter.

Ray's JobCounter is a durable counter (``GetNextJobID``); job ids are its value as 4 bytes
little-endian (Ray's ``JobID::FromInt``).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from gcs.clock import Clock, now_ms
from gcs.ids import JOB_ID_SIZE
from gcs.proto import gcs_pb2
from gcs.rpc.errors import InvalidArgument
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_JOB

log = structlog.get_logger("gcs.jobs")
JOB_COUNTER = "JobCounter"


class JobRejected(InvalidArgument):
    """A validator refused the job; AddJob answers with it in the reply's ``GcsStatus``
    (gRPC OK), as ant-ray does for a bad ``virtual_cluster_id``."""


class JobManager:
    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self.jobs: dict[bytes, gcs_pb2.JobTableData] = {}
        self._on_finished: list[Callable[[gcs_pb2.JobTableData], None]] = []
        self._validators: list[Callable[[gcs_pb2.JobTableData], None]] = []

    def add_validator(self, fn: Callable[[gcs_pb2.JobTableData], None]) -> None:
        """``fn(job)`` runs before AddJob persists anything; it raises ``JobRejected``."""
        self._validators.append(fn)

    def running_in(self, virtual_cluster_id: str) -> bool:
        return any(
            not j.is_dead and j.virtual_cluster_id == virtual_cluster_id for j in self.jobs.values()
        )

    def add_finish_listener(self, fn: Callable[[gcs_pb2.JobTableData], None]) -> None:
        self._on_finished.append(fn)

    async def load(self) -> None:
        for raw in (await self._store.get_all(TABLE_JOB)).values():
            job = gcs_pb2.JobTableData.FromString(raw)
            self.jobs[job.job_id] = job

    async def next_job_id(self) -> int:
        return await self._store.increment(JOB_COUNTER)

    async def add(self, job: gcs_pb2.JobTableData) -> None:
        if len(job.job_id) != JOB_ID_SIZE:
            raise InvalidArgument(f"data.job_id must be {JOB_ID_SIZE} bytes, got {len(job.job_id)}")
        for validate in self._validators:
            validate(job)
        stored = gcs_pb2.JobTableData()
        stored.CopyFrom(job)
        stored.is_dead = False
        if not stored.start_time:
            stored.start_time = now_ms(self._clock)
        await self._store.write(WriteBatch().put(TABLE_JOB, job.job_id, stored.SerializeToString()))
        self.jobs[job.job_id] = stored

    async def mark_finished(self, job_id: bytes) -> bool:
        """Idempotent: finishing a finished (or unknown) job is a no-op returning False."""
        if len(job_id) != JOB_ID_SIZE:
            raise InvalidArgument(f"job_id must be {JOB_ID_SIZE} bytes, got {len(job_id)}")
        job = self.jobs.get(job_id)
        if job is None or job.is_dead:
            return False
        updated = gcs_pb2.JobTableData()
        updated.CopyFrom(job)
        updated.is_dead = True
        updated.end_time = now_ms(self._clock)
        await self._store.write(WriteBatch().put(TABLE_JOB, job_id, updated.SerializeToString()))
        self.jobs[job_id] = updated
        for fn in self._on_finished:
            fn(updated)
        return True
