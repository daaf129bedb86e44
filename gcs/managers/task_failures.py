"""Fail the task attempts of dead workers and finished jobs, after Ray's delays.

Ray's ``GcsTaskManager`` hears worker deaths (``ReportWorkerFailure``) and job ends
(``MarkJobFinished``, a driver's death) and, after a delay that lets the last task events
of the dead process arrive (``gcs_mark_task_failed_on_worker_dead_delay_ms``, 1 s;
``gcs_mark_task_failed_on_job_done_delay_ms``, 15 s), marks every attempt still not
FINISHED or FAILED as FAILED with a ``WORKER_DIED`` error
(:meth:`~gcs.managers.tasks.TaskEventStore.fail_worker_tasks`,
:meth:`~gcs.managers.tasks.TaskEventStore.fail_job_tasks`).  Without it ``ray list tasks``
keeps showing RUNNING tasks whose process is gone.

The task store is in memory and synchronous, so the mark is one step after the delay; the
delays run on the injected clock (tests advance a fake one).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from gcs.base.background import Background
from gcs.base.clock import Clock
from gcs.managers.tasks import TaskEventStore
from gcs.proto import gcs_pb2

log = structlog.get_logger("gcs.task_failures")


class TaskFailureMarker:
    """A worker and job listener (the wiring subscribes it to both fan-outs)."""

    def __init__(
        self,
        tasks: TaskEventStore,
        clock: Clock,
        *,
        worker_dead_delay_ms: int = 1000,
        job_done_delay_ms: int = 15000,
    ) -> None:
        self._tasks = tasks
        self._clock = clock
        self._worker_delay_s = worker_dead_delay_ms / 1000
        self._job_delay_s = job_done_delay_ms / 1000
        self._pending = Background("task_failures")

    # -- listeners -------------------------------------------------------------------------
    def on_worker_dead(self, failure: gcs_pb2.WorkerTableData) -> None:
        worker_id = failure.worker_address.worker_id
        if not worker_id:
            return
        failed = gcs_pb2.WorkerTableData()
        failed.CopyFrom(failure)
        self._later(self._worker_delay_s, lambda: self._fail_worker(worker_id, failed))

    def check_job(self, job: gcs_pb2.JobTableData) -> None:
        return None

    def on_job_finished(self, job: gcs_pb2.JobTableData) -> None:
        job_id, end_time_ms = job.job_id, job.end_time
        self._later(self._job_delay_s, lambda: self._fail_job(job_id, end_time_ms))

    # -- the marks -------------------------------------------------------------------------
    def _fail_worker(self, worker_id: bytes, failure: gcs_pb2.WorkerTableData) -> None:
        marked = self._tasks.fail_worker_tasks(worker_id, failure)
        if marked:
            log.info("tasks.failed_on_worker_dead", worker_id=worker_id.hex(), tasks=marked)

    def _fail_job(self, job_id: bytes, end_time_ms: int) -> None:
        marked = self._tasks.fail_job_tasks(job_id, end_time_ms)
        if marked:
            log.info("tasks.failed_on_job_end", job_id=job_id.hex(), tasks=marked)

    def _later(self, delay_s: float, mark: Callable[[], None]) -> None:
        async def run() -> None:
            await self._clock.sleep(delay_s)
            mark()

        self._pending.spawn(run(), "mark")

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def close(self) -> None:
        await self._pending.close()
