"""Jobs (``ray.rpc.JobInfoGcsService``): the JOB table and the job id counter.

Ray's JobCounter is a durable counter (``GetNextJobID``); job ids are its value as 4 bytes
little-endian (Ray's ``JobID::FromInt``).  AddJob and MarkJobFinished run on the manager's
:class:`~gcs.managers.lane.ApplyLane`; listeners (:class:`~gcs.managers.events.JobEvents`)
check a job before it is persisted and hear of it when it finished.  Every change is
published on ``GCS_JOB_CHANNEL`` (key = job id) after it is applied: raylets start a job's
workers only once they heard of the job there.

A job's virtual cluster: ant-ray's ``JobTableData.virtual_cluster_id`` (field 13, which a
Ray 2.60 driver never sets), else the job's ``JobConfig.metadata["virtual_cluster_id"]``
(:data:`VIRTUAL_CLUSTER_METADATA_KEY`) -- what an unmodified Ray 2.60 driver can send:
``ray.init(job_config=JobConfig(metadata={"virtual_cluster_id": ...}))``, ``ray job submit
--metadata-json``, or ``RAY_JOB_CONFIG_JSON_ENV_VAR``.  The resolved id is stored in the
field, so everything downstream reads one place.

A job whose driver's node dies is finished (Ray's ``GcsJobManager::OnNodeDead``), and so,
at start-up, is a running job whose driver's node is already dead in the node table (a
kill -9 of the GCS between the node's death and its jobs').
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import structlog

from gcs.base.background import Background
from gcs.base.clock import Clock, now_ms
from gcs.base.errors import InvalidArgument
from gcs.base.ids import JOB_ID_SIZE
from gcs.managers.events import JobEvents, NodeDeathListener
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.managers.nodes import Publish, no_publish
from gcs.proto import gcs_pb2, pubsub_pb2
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_JOB

log = structlog.get_logger("gcs.jobs")
JOB_COUNTER = "JobCounter"
VIRTUAL_CLUSTER_METADATA_KEY = "virtual_cluster_id"
"""``JobConfig.metadata`` key naming a Ray 2.60 job's virtual cluster."""


def job_virtual_cluster(job: gcs_pb2.JobTableData) -> str:
    """The field when set, else the job config's metadata entry ("" = none)."""
    return job.virtual_cluster_id or job.config.metadata.get(VIRTUAL_CLUSTER_METADATA_KEY, "")


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
        node_is_dead: Callable[[bytes], bool] = lambda node_id: False,
    ) -> None:
        self._store = store
        self._publish = publish
        self._clock = clock
        self._events = events if events is not None else JobEvents()
        self._lane = ApplyLane(store, "jobs", clock, policy=lane_policy)
        self._node_is_dead = node_is_dead
        self._background = Background("jobs")
        self._jobs: dict[bytes, gcs_pb2.JobTableData] = {}
        self.jobs: Mapping[bytes, gcs_pb2.JobTableData] = MappingProxyType(self._jobs)
        """Every job by id, finished ones included: a read-only live view."""
        self.node_listener = self._NodeListener(self)
        """Finishes the jobs of a dead driver's node (subscribed by the wiring)."""

    class _NodeListener(NodeDeathListener):
        def __init__(self, manager: JobManager) -> None:
            self._m = manager

        def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
            self._m._background.spawn(self._m.finish_jobs_of_node(node.node_id), "node-dead")

    async def settle(self) -> None:
        """Until every event task spawned so far has finished (tests, shutdown)."""
        await self._background.settle()

    async def close(self) -> None:
        await self._background.close()

    async def finish_jobs_of_node(self, node_id: bytes) -> list[bytes]:
        """Mark finished every running job whose driver ran on ``node_id``; their ids."""
        running = [
            job.job_id
            for job in self._jobs.values()
            if not job.is_dead and job.driver_address.node_id == node_id
        ]
        finished = [job_id for job_id in running if await self.mark_finished(job_id)]
        if finished:
            log.info(
                "jobs.finished_with_node",
                node_id=node_id.hex(),
                jobs=[job_id.hex() for job_id in finished],
            )
        return finished

    def all_jobs(self) -> Iterable[gcs_pb2.JobTableData]:
        """Every job, finished ones included."""
        return self._jobs.values()

    def get(self, job_id: bytes) -> gcs_pb2.JobTableData | None:
        return self._jobs.get(job_id)

    def virtual_cluster_of(self, job_id: bytes) -> str:
        """The virtual cluster a known job runs in ("" for unknown jobs / the primary)."""
        job = self._jobs.get(job_id)
        return job.virtual_cluster_id if job is not None else ""

    def is_dead(self, job_id: bytes) -> bool:
        """A known job that finished (unknown jobs are not dead: actors and groups may be
        registered without a job record, e.g. by our raylet agent's tests)."""
        job = self._jobs.get(job_id)
        return job is not None and job.is_dead

    def namespace_of(self, job_id: bytes) -> str:
        """The Ray namespace a known job runs in ("" for unknown jobs)."""
        job = self._jobs.get(job_id)
        return job.config.ray_namespace if job is not None else ""

    async def load(self) -> None:
        """Reload the JOB table; then finish running jobs whose driver's node is dead (load
        the node table first)."""
        for raw in (await self._store.get_all(TABLE_JOB)).values():
            job = gcs_pb2.JobTableData.FromString(raw)
            self._jobs[job.job_id] = job
        orphaned = {
            job.driver_address.node_id
            for job in self._jobs.values()
            if not job.is_dead and self._node_is_dead(job.driver_address.node_id)
        }
        for node_id in sorted(orphaned):
            await self.finish_jobs_of_node(node_id)

    async def next_job_id(self) -> int:
        return await self._store.increment(JOB_COUNTER)

    async def add(self, job: gcs_pb2.JobTableData) -> None:
        if len(job.job_id) != JOB_ID_SIZE:
            raise InvalidArgument(f"data.job_id must be {JOB_ID_SIZE} bytes, got {len(job.job_id)}")
        stored = gcs_pb2.JobTableData()
        stored.CopyFrom(job)
        stored.is_dead = False
        stored.virtual_cluster_id = job_virtual_cluster(stored)
        # Ray's GcsJobManager stamps both with its own clock, over what the driver sent.
        stored.start_time = stored.timestamp = now_ms(self._clock)
        async with self._lane:
            for listener in self._events:
                listener.check_job(stored)

            def apply() -> None:
                self._jobs[stored.job_id] = stored
                self._publish(pubsub_pb2.GCS_JOB_CHANNEL, stored.job_id, stored)

            batch = WriteBatch().put(TABLE_JOB, job.job_id, stored.SerializeToString())
            await self._lane.commit(batch, apply)

    async def mark_finished(self, job_id: bytes) -> bool:
        """Idempotent: finishing a finished (or unknown) job is a no-op returning False."""
        if len(job_id) != JOB_ID_SIZE:
            raise InvalidArgument(f"job_id must be {JOB_ID_SIZE} bytes, got {len(job_id)}")
        async with self._lane:
            job = self._jobs.get(job_id)
            if job is None or job.is_dead:
                return False
            updated = gcs_pb2.JobTableData()
            updated.CopyFrom(job)
            updated.is_dead = True
            updated.end_time = updated.timestamp = now_ms(self._clock)

            def apply() -> None:
                self._jobs[job_id] = updated
                for listener in self._events:
                    listener.on_job_finished(updated)
                self._publish(pubsub_pb2.GCS_JOB_CHANNEL, job_id, updated)

            batch = WriteBatch().put(TABLE_JOB, job_id, updated.SerializeToString())
            await self._lane.commit(batch, apply)
            return True
