"""Runtime-env package references (``ray.rpc.RuntimeEnvGcsService/PinRuntimeEnvURI``).

A driver uploads its ``working_dir`` / ``py_modules`` packages into internal KV (empty
namespace, key = the ``gcs://_ray_pkg_<hash>.zip`` URI) and pins each URI for a while
(``expiration_s``) so it survives until a job or actor references it.  As in Ray's GCS, a
``gcs://`` package is deleted from KV once nothing references it: no unexpired pin and no
live job whose runtime env names it (``JobConfig.runtime_env_info.uris``).  Other schemes
(``s3://``, ``https://``...) are only counted; their storage is not ours.

Bookkeeping on an injected clock; the server calls :meth:`expire` periodically and
deletes what it returns.  A URI held back by a live job is released when that job finishes
(``on_job_finished``, a job listener).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable

from gcs.clock import Clock
from gcs.managers.events import JobEvents
from gcs.proto import gcs_pb2

GCS_SCHEME = "gcs://"


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
        *,
        job_events: JobEvents,
    ) -> None:
        self._live_jobs = live_jobs
        self._clock = clock
        self._pins: dict[str, int] = {}
        """URI -> unexpired pins."""
        self._due: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._held_by_jobs: set[str] = set()
        self._released: list[str] = []
        self.deleted = 0
        job_events.subscribe(self)

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
            for uri in candidates:
                if uri in in_use:
                    self._held_by_jobs.add(uri)
                elif uri.startswith(GCS_SCHEME):
                    unused.append(uri)
        self.deleted += len(unused)
        return unused

    def _uris_of_live_jobs(self) -> set[str]:
        out: set[str] = set()
        for job in self._live_jobs():
            if not job.is_dead:
                out |= job_uris(job)
        return out

    # -- JobListener ---------------------------------------------------------------------
    def check_job(self, job: gcs_pb2.JobTableData) -> None:
        return None

    def on_job_finished(self, job: gcs_pb2.JobTableData) -> None:
        mine = job_uris(job) & self._held_by_jobs
        if not mine:
            return
        in_use = self._uris_of_live_jobs()
        for uri in mine:
            if uri not in in_use and not self.pinned(uri):
                self._held_by_jobs.discard(uri)
                if uri.startswith(GCS_SCHEME):
                    self._released.append(uri)
