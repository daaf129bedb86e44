"""What a job exports to internal KV for its workers, removed once nothing can run it.

A Ray driver exports every remote function, actor class and worker setup hook it uses into
internal KV namespace ``fun``, under ``RemoteFunction:<job hex>:``, ``ActorClass:<job hex>:``
and ``FunctionsToRun:<job hex>:`` (each a pickled closure: a task capturing 1 MiB exports
1 MiB).  Only the job's own workers read them.  Ray's GCS deletes them once the job has
finished and the last detached actor it created is dead (its ``GCSFunctionManager``), else a
long-lived cluster keeps every finished job's closures in the store for ever; so do we: the
actor manager says when (``ActorManager(on_job_released=...)``), :func:`remove_exports`
deletes.
"""

from __future__ import annotations

import structlog

from gcs.base.errors import GcsError
from gcs.managers.kv import KvManager

__all__ = ["EXPORT_KINDS", "FUNCTION_NAMESPACE", "export_prefixes", "remove_exports"]

log = structlog.get_logger("gcs.exports")

FUNCTION_NAMESPACE = b"fun"
EXPORT_KINDS = (b"RemoteFunction", b"ActorClass", b"FunctionsToRun")
"""Ray's key kinds in ``fun`` (``FunctionsToRun`` is its ``kWorkerSetupHookKeyName``)."""


def export_prefixes(job_id: bytes) -> list[bytes]:
    """The key prefixes of one job's exports (``<kind>:<job hex>:``)."""
    job_hex = job_id.hex().encode()
    return [kind + b":" + job_hex + b":" for kind in EXPORT_KINDS]


async def remove_exports(kv: KvManager, job_id: bytes) -> int:
    """Delete the job's exports; the number of keys removed.  A store that fails leaves them
    (as Ray's GCS, which ignores the outcome of these deletes): logged, not raised."""
    removed = 0
    try:
        for prefix in export_prefixes(job_id):
            removed += await kv.delete(FUNCTION_NAMESPACE, prefix, by_prefix=True)
    except GcsError as err:
        log.warning("job.exports_not_removed", job_id=job_id.hex(), error=str(err))
        return removed
    if removed:
        log.info("job.exports_removed", job_id=job_id.hex(), keys=removed)
    return removed
