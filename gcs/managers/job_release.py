"""What Ray's GCS keeps for a finished job until nothing can run its code any more.

A job's runtime-env packages and its exported functions outlive the job while a detached
actor it created is alive (the actor runs the job's code in the job's runtime env).  The
actor manager says when the last one died (``ActorManager(on_job_released=...)``); then
:class:`JobRelease` lets go of both.  The runtime-env pins ask :func:`held_by_job_or_actors`
whether a job still references its URIs, and delete a package with :func:`kv_package_deleter`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gcs.managers.exported_functions import remove_exports
from gcs.managers.kv import KvManager
from gcs.managers.runtime_env import RuntimeEnvPins
from gcs.proto import gcs_pb2

__all__ = ["JobRelease", "held_by_job_or_actors", "kv_package_deleter"]


def held_by_job_or_actors(
    detached_alive: Callable[[bytes], bool],
) -> Callable[[gcs_pb2.JobTableData], bool]:
    """A job references its runtime env while it runs or a detached actor it created
    lives (``detached_alive(job_id)``)."""

    def holds(job: gcs_pb2.JobTableData) -> bool:
        return not job.is_dead or detached_alive(job.job_id)

    return holds


def kv_package_deleter(kv: KvManager) -> Callable[[str], Awaitable[None]]:
    """Deletes a ``gcs://`` package: its URI is its key in internal KV's empty namespace."""

    async def delete(uri: str) -> None:
        await kv.delete(b"", uri.encode(), by_prefix=False)

    return delete


class JobRelease:
    """Told once a finished job's last detached actor died (or it had none)."""

    def __init__(self, runtime_envs: RuntimeEnvPins, kv: KvManager) -> None:
        self._runtime_envs = runtime_envs
        self._kv = kv

    async def __call__(self, job_id: bytes) -> None:
        self._runtime_envs.on_job_released(job_id)
        await remove_exports(self._kv, job_id)
