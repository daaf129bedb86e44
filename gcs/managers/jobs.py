"""Jobs (``ray.rpc.JobInfoGcsService``): the JOB table and the job id counter.

Ray's JobCounter is a durable counter (``GetNextJobID``); job ids are its value as 4 bytes
little-endian (Ray's ``JobID::FromInt``).  AddJob and MarkJobFinished run on the manager's
:class:`~gcs.managers.lane.ApplyLane`; listeners (:class:`~gcs.managers.events.JobEvents`)
check a job before it is persisted and hear of it when it finished.  Every change is
published on ``GCS_JOB_CHANNEL`` (key = job id) after it is applied: raylets start a job's
workers only once they heard of the job there.

A node's death finishes the running jobs whose driver was on it (Ray's
``GcsJobManager::OnNodeDead``): no raylet is left to report those drivers' exit, and the
job's end lets listeners fail its tasks (``gcs.managers.task_failures``) and actors.
"""

from __future__ import annotations

import asyncio

import structlog

from gcs.clock import Clock, now_ms
from gcs.errors import InvalidArgument
from gcs.ids import JOB_ID_SIZE
from gcs.managers.events import JobEvents, NodeEvents
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.managers.nodes import Publish, no_publish
from gcs.proto import gcs_pb2, pubsub_pb2
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_JOB

log = structlog.get_logger("gcs.jobs")
JOB_COUNTER = "JobCounter"


class JobRejected(InvalidArgument):
    """A validator refused the job; AddJob answers with it in the reply's ``GcsStatus``
    (gRPC OK), as ant-ray does for a bad ``virtual_cluster_id``."""


class JobManager:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        events: JobEvents | None = None,
        publish: Publish = no_publish,
        lane_policy: ResolvePolicy | None = None,
        node_events: NodeEvents | None = None,
    ) -> None:
        self._store = store
        self._publish = publish
        self._clock = clock
        self._events = events if events is not None else JobEvents()
        self._lane = ApplyLane(store, "jobs", policy=lane_policy)
        self.jobs: dict[bytes, gcs_pb2.JobTableData] = {}
        self._background: set[asyncio.Task[int]] = set()
        if node_events is not None:
            node_events.subscribe(self)

    # -- node listener -------------------------------------------------------------------
    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        return None

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous test of another manager)
            return
        task = loop.create_task(self.finish_jobs_of_node(node.node_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def finish_jobs_of_node(self, node_id: bytes) -> int:
        """Finish the running jobs whose driver ran on ``node_id``; returns how many."""
        doomed = [
            job_id
            for job_id, job in self.jobs.items()
            if not job.is_dead and job.driver_address.node_id == node_id
        ]
        finished = 0
        for job_id in doomed:
            if await self.mark_finished(job_id):  # re-checks on the lane
                log.info("job.finished_with_node", job_id=job_id.hex(), node_id=node_id.hex())
                finished += 1
        return finished

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def running_in(self, virtual_cluster_id: str) -> bool:
        return any(
            not j.is_dead and j.virtual_cluster_id == virtual_cluster_id for j in self.jobs.values()
        )

    def virtual_cluster_of(self, job_id: bytes) -> str:
        """The virtual cluster a known job runs in ("" for unknown jobs / the primary)."""
        job = self.jobs.get(job_id)
        return job.virtual_cluster_id if job is not None else ""

    def namespace_of(self, job_id: bytes) -> str:
        """The Ray namespace a known job runs in ("" for unknown jobs)."""
        job = self.jobs.get(job_id)
        return job.config.ray_namespace if job is not None else ""

    async def load(self) -> None:
        for raw in (await self._store.get_all(TABLE_JOB)).values():
            job = gcs_pb2.JobTableData.FromString(raw)
            self.jobs[job.job_id] = job

    async def next_job_id(self) -> int:
        return await self._store.increment(JOB_COUNTER)

    async def add(self, job: gcs_pb2.JobTableData) -> None:
        if len(job.job_id) != JOB_ID_SIZE:
            raise InvalidArgument(f"data.job_id must be {JOB_ID_SIZE} bytes, got {len(job.job_id)}")
        stored = gcs_pb2.JobTableData()
        stored.CopyFrom(job)
        stored.is_dead = False
        if not stored.start_time:
            stored.start_time = now_ms(self._clock)
        async with self._lane:
            self._events.check(stored)

            def apply() -> None:
                self.jobs[stored.job_id] = stored
                self._publish(pubsub_pb2.GCS_JOB_CHANNEL, stored.job_id, stored)

            batch = WriteBatch().put(TABLE_JOB, job.job_id, stored.SerializeToString())
            await self._lane.commit(batch, apply)

    async def mark_finished(self, job_id: bytes) -> bool:
        """Idempotent: finishing a finished (or unknown) job is a no-op returning False."""
        if len(job_id) != JOB_ID_SIZE:
            raise InvalidArgument(f"job_id must be {JOB_ID_SIZE} bytes, got {len(job_id)}")
        async with self._lane:
            job = self.jobs.get(job_id)
            if job is None or job.is_dead:
                return False
            updated = gcs_pb2.JobTableData()
            updated.CopyFrom(job)
            updated.is_dead = True
            updated.end_time = now_ms(self._clock)

            def apply() -> None:
                self.jobs[job_id] = updated
                self._events.finished(updated)
                self._publish(pubsub_pb2.GCS_JOB_CHANNEL, job_id, updated)

            batch = WriteBatch().put(TABLE_JOB, job_id, updated.SerializeToString())
            await self._lane.commit(batch, apply)
            return True
