"""Runtime-env package references (``ray.rpc.RuntimeEnvGcsService/PinRuntimeEnvURI``).

A driver uploads its ``working_dir`` / ``py_modules`` packages into internal KV (empty
namespace, key = the ``gcs://_ray_pkg_<hash>.zip`` URI) and pins each URI for a while
(``expiration_s``) so it survives until a job or actor references it.  As in Ray's GCS, a
``gcs://`` package is deleted from KV once nothing references it: no unexpired pin and no
live job whose runtime env names it (``JobConfig.runtime_env_info.uris``).  Other schemes
(``s3://``, ``https://``...) are only counted; their storage is not ours.

Bookkeeping on an injected clock; :meth:`RuntimeEnvPins.run` calls :meth:`expire` every
second of it and deletes what it returns.  A job references its URIs while it holds them
(``holds``: while it runs, and -- wired -- while a detached actor it created lives, whose
runtime env is the job's); when it lets go (``on_job_finished``, a job listener, or
``on_job_released`` once its last detached actor died), every URI of it that no other
holding job names and no pin keeps is released.  A driver pins nothing when
``RAY_RUNTIME_ENV_URI_PIN_EXPIRATION_S`` is 0: the job's reference is then the only one,
and its package is deleted when the job ends (as Ray's GCS does).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Awaitable, Callable, Iterable

import structlog

from gcs.base.clock import Clock
from gcs.base.errors import Unavailable
from gcs.proto import gcs_pb2

log = structlog.get_logger("gcs.runtime_env")

GCS_SCHEME = "gcs://"
EXPIRE_EVERY_S = 1.0


def job_uris(job: gcs_pb2.JobTableData) -> set[str]:
    uris = job.config.runtime_env_info.uris
    out = set(uris.py_modules_uris)
    if uris.working_dir_uri:
        out.add(uris.working_dir_uri)
    return out


class RuntimeEnvPins:
    def __init__(
        self,
        live_jobs: Callable[[], Iterable[gcs_pb2.JobTableData]],
        clock: Clock,
        delete: Callable[[str], Awaitable[object]] | None = None,
        holds: Callable[[gcs_pb2.JobTableData], bool] | None = None,
        job: Callable[[bytes], gcs_pb2.JobTableData | None] | None = None,
    ) -> None:
        """``delete``: removes an unreferenced package from internal KV (the loop's job).
        ``holds``: whether a job still references its URIs (default: while it runs).
        ``job``: a job by id (for ``on_job_released``)."""
        self._live_jobs = live_jobs
        self._holds = holds or (lambda job: not job.is_dead)
        self._job = job
        self._delete = delete
        self._clock = clock
        self._pins: dict[str, int] = {}
        """URI -> unexpired pins."""
        self._due: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._released: list[str] = []
        self.deleted = 0

    def pinned(self, uri: str) -> bool:
        return self._pins.get(uri, 0) > 0

    def pin(self, uri: str, expiration_s: float) -> None:
        now_s = self._clock.monotonic_s()
        self._pins[uri] = self._pins.get(uri, 0) + 1
        heapq.heappush(self._due, (now_s + max(expiration_s, 0), next(self._seq), uri))

    def expire(self) -> list[str]:
        """Pins now due end; returns the ``gcs://`` URIs nothing references any
        more (the caller deletes them from KV), including those a finished job released."""
        now_s = self._clock.monotonic_s()
        unused = self._released
        self._released = []
        candidates = []
        while self._due and self._due[0][0] <= now_s:
            _, _, uri = heapq.heappop(self._due)
            left = self._pins[uri] - 1
            if left:
                self._pins[uri] = left
            else:
                del self._pins[uri]
                candidates.append(uri)
        if candidates:
            in_use = self._uris_of_live_jobs()
            for uri in candidates:  # one a holding job names goes when the job lets go
                if uri not in in_use and uri.startswith(GCS_SCHEME):
                    unused.append(uri)
        self.deleted += len(unused)
        return unused

    async def run(self) -> None:
        """Delete unreferenced ``gcs://`` packages every second of the injected clock; one
        the store could not delete now is tried again next time."""
        while True:
            for uri in self.expire():
                if self._delete is not None:
                    try:
                        await self._delete(uri)
                    except Unavailable as err:
                        self._released.append(uri)
                        self.deleted -= 1
                        log.warning("runtime_env.delete_failed", uri=uri, error=err.message)
                        continue
                log.info("runtime_env.deleted", uri=uri)
            await self._clock.sleep(EXPIRE_EVERY_S)

    def _uris_of_live_jobs(self) -> set[str]:
        out: set[str] = set()
        for job in self._live_jobs():
            if self._holds(job):
                out |= job_uris(job)
        return out

    # -- JobListener ---------------------------------------------------------------------
    def check_job(self, job: gcs_pb2.JobTableData) -> None:
        return None

    def on_job_finished(self, job: gcs_pb2.JobTableData) -> None:
        self._let_go(job)

    def on_job_released(self, job_id: bytes) -> None:
        """The last detached actor of a finished job died (the actor manager's hook)."""
        job = self._job(job_id) if self._job is not None else None
        if job is not None:
            self._let_go(job)

    def _let_go(self, job: gcs_pb2.JobTableData) -> None:
        if self._holds(job):
            return
        mine = job_uris(job)
        if not mine:
            return
        in_use = self._uris_of_live_jobs()
        for uri in mine:
            if uri in in_use or self.pinned(uri):
                continue  # another job's, or a pin ends later (expire() decides then)
            if uri.startswith(GCS_SCHEME) and uri not in self._released:
                self._released.append(uri)
