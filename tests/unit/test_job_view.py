"""The job API's record as Ray's GCS reads it (``gcs.managers.job_view``)."""

from __future__ import annotations

import json

from gcs.managers.job_view import parse_job_api_info, select_jobs
from gcs.proto import gcs_pb2


class TestJobApiInfo:
    def test_nulls_are_unset_fields(self) -> None:
        info = parse_job_api_info(
            json.dumps({"status": "SUCCEEDED", "entrypoint": "x", "driver_exit_code": None})
        )
        assert info.status == "SUCCEEDED" and not info.HasField("driver_exit_code")

    def test_a_field_rays_proto_lacks_keeps_the_rest(self) -> None:
        """A newer job manager's extra field: Ray logs the parse error and keeps what it
        parsed; we keep every known field."""
        raw = json.dumps({"status": "RUNNING", "entrypoint": "x", "brand_new": 1}).encode()
        info = parse_job_api_info(raw)
        assert (info.status, info.entrypoint) == ("RUNNING", "x")

    def test_garbage_is_an_empty_record(self) -> None:
        assert parse_job_api_info(b"\xff not json") == gcs_pb2.JobsAPIInfo()


class TestSelectJobs:
    def test_the_limit_counts_kept_jobs_not_scanned_ones(self) -> None:
        jobs = [gcs_pb2.JobTableData(job_id=n.to_bytes(4, "little")) for n in (1, 2, 3)]
        jobs[2].config.metadata["job_submission_id"] = "sub"
        assert [j.job_id for j in select_jobs(jobs, job_or_submission_id="sub", limit=1)] == [
            jobs[2].job_id
        ]
        assert select_jobs(jobs, job_or_submission_id=None, limit=0) == []

    def test_copies_never_the_stored_records(self) -> None:
        jobs = [gcs_pb2.JobTableData(job_id=b"\x01\x00\x00\x00")]
        (copy,) = select_jobs(jobs, job_or_submission_id=None, limit=None)
        copy.is_running_tasks = True
        assert not jobs[0].HasField("is_running_tasks")
