"""Job-cluster lifecycle: lazy destruction when the job ends, GC of expired job clusters."""

from __future__ import annotations

from dataclasses import replace

from gcs.policy.virtual_clusters import messages as msg
from gcs.policy.virtual_clusters.allocation import in_use, remove_job_cluster
from gcs.policy.virtual_clusters.errors import VcInvalidArgument
from gcs.policy.virtual_clusters.ids import is_job_cluster_id
from gcs.policy.virtual_clusters.model import Draft, Kind
from gcs.policy.virtual_clusters.plan import PlanBuilder
from gcs.policy.virtual_clusters.revision import RevisionSource
from gcs.policy.virtual_clusters.usage import UsageView


def on_job_finished(
    builder: PlanBuilder, revisions: RevisionSource, usage: UsageView, cluster_id: str
) -> None:
    """Mark the job cluster dead (in memory only); remove it now unless still in use."""
    draft = builder.draft
    if not is_job_cluster_id(cluster_id):
        return
    job = draft.get(cluster_id)
    if job is None or job.kind is not Kind.JOB:
        return
    job = replace(job, job_dead=True)
    draft.put(job)
    if not in_use(draft, job, usage):
        remove_job_cluster(builder, revisions, job)


def collect_expired(
    builder: PlanBuilder,
    revisions: RevisionSource,
    usage: UsageView,
    only: str | None = None,
) -> None:
    """Remove every ``job_dead`` job cluster no longer in use (or just ``only``)."""
    draft = builder.draft
    for job in draft.clusters():
        if job.kind is not Kind.JOB or not job.job_dead or only not in (None, job.id):
            continue
        if not in_use(draft, job, usage):
            remove_job_cluster(builder, revisions, job)


def check_job_virtual_cluster(draft: Draft, cluster_id: str) -> None:
    """AddJob: a job may only run in an indivisible logical cluster or a job cluster."""
    if not cluster_id:
        return
    cluster = draft.get(cluster_id)
    if cluster is None or cluster.divisible:
        raise VcInvalidArgument(msg.invalid_job_cluster(cluster_id))
