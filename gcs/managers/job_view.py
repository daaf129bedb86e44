"""What ``GetAllJobInfo`` answers, as Ray 2.60's ``GcsJobManager`` builds it.

The JOB table's records, filtered and limited, then two optional fill-ins made
concurrently (each skipped when the request asks):

* ``job_info``: for a job the job API submitted (``config.metadata["job_submission_id"]``),
  the job API's own record, the JSON it keeps in internal KV (namespace ``job``, key
  ``_ray_internal_job_info_<submission id>``), parsed into ``JobsAPIInfo``
  (``skip_submission_job_info_field``);
* ``is_running_tasks``: False for a finished job, else whether its driver reports pending
  tasks (``CoreWorkerService.NumPendingTasks``, 1 s); left unset when the driver does not
  answer (``skip_is_running_tasks_field``).

``job_or_submission_id`` matches a job's hex id or its submission id, so ``ray job status
<submission id>`` finds the submitted job's driver.  ``limit`` counts the jobs kept (0
keeps none); a negative one is refused by the servicer with Ray's in-reply "Invalid limit".
Reads only: the stored records are copied, never changed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable

import structlog
from google.protobuf import json_format

from gcs.base.errors import WorkerUnreachable
from gcs.proto import gcs_pb2
from gcs.rpc.drivers import DriverGateway

log = structlog.get_logger("gcs.jobs")

SUBMISSION_ID_METADATA_KEY = "job_submission_id"
"""``JobConfig.metadata`` key the job API sets on the jobs it submits."""
JOB_API_KV_NAMESPACE = b"job"
JOB_API_KEY_PREFIX = "_ray_internal_job_info_"
NUM_PENDING_TASKS_TIMEOUT_S = 1.0
"""Ray's ``kNumPendingTasksRequestTimeoutMs``."""
MAX_DRIVER_CALLS = 64
"""Drivers asked at once (Ray asks all at once; a listing of thousands of running jobs
would open thousands of connections)."""

KvMultiGet = Callable[[bytes, list[bytes]], Awaitable[dict[bytes, bytes]]]


def submission_id_of(job: gcs_pb2.JobTableData) -> str | None:
    return job.config.metadata.get(SUBMISSION_ID_METADATA_KEY)


def job_api_key(submission_id: str) -> bytes:
    return f"{JOB_API_KEY_PREFIX}{submission_id}".encode()


def parse_job_api_info(raw: bytes) -> gcs_pb2.JobsAPIInfo:
    """The job API's JSON as ``JobsAPIInfo``; fields Ray's proto lacks are skipped (Ray
    logs the parse error and keeps what it parsed)."""
    info = gcs_pb2.JobsAPIInfo()
    try:
        json_format.Parse(raw, info)
    except (json_format.ParseError, json.JSONDecodeError, UnicodeDecodeError) as err:
        log.error("jobs.job_api_info_unparsable", error=str(err)[:200])
        info.Clear()
        try:
            json_format.Parse(raw, info, ignore_unknown_fields=True)
        except (json_format.ParseError, json.JSONDecodeError, UnicodeDecodeError):
            info.Clear()
    return info


def select_jobs(
    jobs: Iterable[gcs_pb2.JobTableData], *, job_or_submission_id: str | None, limit: int | None
) -> list[gcs_pb2.JobTableData]:
    """Copies of the jobs matching ``job_or_submission_id`` (hex job id or submission id;
    None: all), at most ``limit`` of them (None: no limit)."""
    kept: list[gcs_pb2.JobTableData] = []
    for job in jobs:
        if limit is not None and len(kept) >= limit:
            break
        if job_or_submission_id is not None and job_or_submission_id not in (
            job.job_id.hex(),
            submission_id_of(job),
        ):
            continue
        copy = gcs_pb2.JobTableData()
        copy.CopyFrom(job)
        kept.append(copy)
    return kept


class JobView:
    def __init__(
        self,
        jobs: Callable[[], Iterable[gcs_pb2.JobTableData]],
        kv_multi_get: KvMultiGet,
        drivers: DriverGateway,
    ) -> None:
        self._jobs = jobs
        self._kv_multi_get = kv_multi_get
        self._drivers = drivers
        self._driver_calls = asyncio.Semaphore(MAX_DRIVER_CALLS)

    async def all_job_info(
        self,
        *,
        job_or_submission_id: str | None,
        limit: int | None,
        with_job_api_info: bool,
        with_running_tasks: bool,
    ) -> list[gcs_pb2.JobTableData]:
        out = select_jobs(self._jobs(), job_or_submission_id=job_or_submission_id, limit=limit)
        fills: list[Awaitable[None]] = []
        if with_running_tasks:
            fills.extend(self._fill_running(job) for job in out)
        if with_job_api_info:
            fills.append(self._fill_job_api_info(out))
        await asyncio.gather(*fills)
        return out

    async def _fill_running(self, job: gcs_pb2.JobTableData) -> None:
        if job.is_dead:
            job.is_running_tasks = False
            return
        try:
            async with self._driver_calls:
                pending = await self._drivers.num_pending_tasks(
                    job.driver_address, NUM_PENDING_TASKS_TIMEOUT_S
                )
        except WorkerUnreachable as err:
            log.warning("jobs.num_pending_tasks_failed", job_id=job.job_id.hex(), error=str(err))
            job.ClearField("is_running_tasks")
            return
        job.is_running_tasks = pending > 0

    async def _fill_job_api_info(self, jobs: list[gcs_pb2.JobTableData]) -> None:
        by_key: dict[bytes, list[gcs_pb2.JobTableData]] = {}
        for job in jobs:
            submission_id = submission_id_of(job)
            if submission_id is not None:
                by_key.setdefault(job_api_key(submission_id), []).append(job)
        if not by_key:
            return
        found = await self._kv_multi_get(JOB_API_KV_NAMESPACE, list(by_key))
        for key, raw in found.items():
            if not raw:
                continue
            info = parse_job_api_info(raw)
            for job in by_key.get(key, ()):
                job.job_info.CopyFrom(info)
