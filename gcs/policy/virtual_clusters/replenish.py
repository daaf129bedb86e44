"""Periodic dead-node replacement (the intended rules of ant-ray's design doc).

Per round, at most one dead node per template per cluster is replaced (ant-ray's pace):

* job cluster J of divisible P: an alive undivided node of the same template from the primary,
  else from P's undivided nodes. The dead node returns to the donor's undivided pool (quirk
  Q5 fixed: with a P donor the dead node goes back to P's undivided bucket). Flush J (publish)
  and P (no publish);
* divisible logical P's own undivided dead nodes: replaced from the primary; flush P only;
* indivisible logical L: replaced from the primary; flush + publish L;
* the primary's own undivided dead nodes: nothing (quirk Q6 not copied).

Revisions are not changed (ant-ray). Without an alive donor nothing happens.
"""

from __future__ import annotations

from gcs.policy.virtual_clusters.ids import PRIMARY_CLUSTER_ID, UNDIVIDED
from gcs.policy.virtual_clusters.model import Cluster, Draft, Kind
from gcs.policy.virtual_clusters.plan import PlanBuilder


def _dead_per_template(draft: Draft, node_ids: list[str]) -> list[str]:
    """The first dead node of each template (templates in sorted order)."""
    first: dict[str, str] = {}
    for node_id in node_ids:
        if draft.is_dead(node_id):
            first.setdefault(draft.template(node_id), node_id)
    return [first[t] for t in sorted(first)]


def _alive_donor(draft: Draft, pool: Cluster, template: str) -> str | None:
    found = draft.lowest_alive_undivided(pool, template, 1)
    return found[0] if found else None


def _swap_from_primary(draft: Draft, holder: Cluster, dead: str, donor: str, bucket: str) -> None:
    """Move ``donor`` from the primary's undivided pool into ``holder`` (under ``bucket``) and
    ``dead`` from ``holder`` into the primary's undivided pool."""
    primary = draft.primary()
    if holder.id == PRIMARY_CLUSTER_ID:
        draft.put(primary.moved(add={donor: bucket, dead: UNDIVIDED}, template=draft.template))
        return
    draft.put(primary.moved(add={dead: UNDIVIDED}, remove=[donor], template=draft.template))
    draft.put(holder.moved(add={donor: bucket}, remove=[dead], template=draft.template))


def _replenish_job(builder: PlanBuilder, job_id: str) -> None:
    draft = builder.draft
    job = draft.get(job_id)
    assert job is not None
    for dead in _dead_per_template(draft, sorted(job.members)):
        template = draft.template(dead)
        parent = draft.get(job.parent_id)
        assert parent is not None
        donor = _alive_donor(draft, draft.primary(), template)
        if donor is not None:
            _swap_from_primary(draft, parent, dead, donor, job.id)
        else:
            donor = _alive_donor(draft, parent, template)
            if donor is None:
                continue
            draft.put(parent.moved(add={donor: job.id, dead: UNDIVIDED}, template=draft.template))
        job = job.moved(add={donor: UNDIVIDED}, remove=[dead], template=draft.template)
        draft.put(job)
        builder.flush(job.id)
        builder.flush(job.parent_id)


def _replenish_undivided(builder: PlanBuilder, cluster_id: str) -> None:
    draft = builder.draft
    cluster = draft.get(cluster_id)
    assert cluster is not None
    for dead in _dead_per_template(draft, cluster.undivided()):
        donor = _alive_donor(draft, draft.primary(), draft.template(dead))
        if donor is None:
            continue
        cluster = draft.get(cluster_id)
        assert cluster is not None
        _swap_from_primary(draft, cluster, dead, donor, UNDIVIDED)
        builder.flush(cluster_id)


def replenish(builder: PlanBuilder) -> None:
    draft = builder.draft
    for parent in [draft.primary(), *draft.logical()]:
        if parent.kind is Kind.INDIVISIBLE:
            _replenish_undivided(builder, parent.id)
            continue
        for job in draft.jobs_of(parent.id):
            _replenish_job(builder, job.id)
        if parent.kind is Kind.DIVISIBLE:
            _replenish_undivided(builder, parent.id)
