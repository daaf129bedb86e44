"""Membership operations: pre-checks in ant-ray's order, then node selection, then a plan.

Node choice is deterministic (ant-ray uses hash order): growing takes alive nodes by ascending
node id; shrinking takes dead nodes first, then by ascending node id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace

from gcs.policy.virtual_clusters import messages as msg
from gcs.policy.virtual_clusters.errors import (
    VcInvalid,
    VcInvalidArgument,
    VcNotFound,
    VcOutOfResource,
    VcUnsafeToRemove,
)
from gcs.policy.virtual_clusters.ids import (
    PRIMARY_CLUSTER_ID,
    UNDIVIDED,
    build_job_cluster_id,
    id_problem,
    is_job_cluster_id,
    parent_id,
)
from gcs.policy.virtual_clusters.launchable import (
    NO_AUTOSCALER,
    Launchable,
    covers,
    known_templates,
)
from gcs.policy.virtual_clusters.model import Cluster, Draft, Kind, floor
from gcs.policy.virtual_clusters.plan import PlanBuilder
from gcs.policy.virtual_clusters.revision import RevisionSource
from gcs.policy.virtual_clusters.usage import UsageView


def in_use(draft: Draft, cluster: Cluster, usage: UsageView) -> bool:
    """Divisible: it has a job cluster. Indivisible: workload registered or a busy alive node."""
    if cluster.divisible:
        return bool(draft.jobs_of(cluster.id))
    if usage.has_workload(cluster.id):
        return True
    return any(not draft.is_dead(n) and not usage.is_node_idle(n) for n in sorted(cluster.members))


def _validate_id(cluster_id: str, primary_message: str) -> None:
    if not cluster_id:
        raise VcInvalidArgument(msg.ID_EMPTY)
    if cluster_id == PRIMARY_CLUSTER_ID:
        raise VcInvalidArgument(primary_message)


def _validate_replica_sets(cluster_id: str, replica_sets: Mapping[str, int]) -> None:
    for template, replicas in replica_sets.items():
        if replicas < 0:
            raise VcInvalidArgument(msg.replicas_negative(replicas, cluster_id))
        if not template:
            raise VcInvalidArgument(msg.template_empty(cluster_id))


def _pick_grow(
    draft: Draft, donor: Cluster, wanted: Mapping[str, int]
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Alive undivided nodes of ``donor`` per template (lowest ids first), and how many could
    be had. Only the wanted templates' candidates are looked at (the donor's undivided index):
    this is the hot path, with a 10,000-node primary as donor."""
    chosen: dict[str, list[str]] = {}
    possible: dict[str, int] = {}
    for template, count in wanted.items():
        chosen[template] = draft.lowest_alive_undivided(donor, template, count)
        possible[template] = len(chosen[template])
    return chosen, possible


def _pick_shrink(
    draft: Draft, cluster: Cluster, unwanted: Mapping[str, int], usage: UsageView
) -> tuple[dict[str, list[str]], dict[str, int]]:
    chosen: dict[str, list[str]] = {}
    possible: dict[str, int] = {}
    index = cluster.undivided_index(draft.template)
    for template, count in unwanted.items():
        matching = [
            n
            for n in index.get(template, ())
            if cluster.divisible or draft.is_dead(n) or usage.is_node_idle(n)
        ]
        matching.sort(key=lambda n: (not draft.is_dead(n), n))
        chosen[template] = matching[:count]
        possible[template] = min(count, len(matching))
    return chosen, possible


def _flatten(chosen: Mapping[str, list[str]]) -> list[str]:
    return [n for nodes in chosen.values() for n in nodes]


def _short_of_floor(
    cluster: Cluster, before: Mapping[str, int], after: Mapping[str, int]
) -> dict[str, int]:
    """Templates an autoscaler move would shrink below the cluster's floor (floor values)."""
    return {
        t: n
        for t, n in floor(cluster).items()
        if after.get(t, 0) < n and after.get(t, 0) < before.get(t, 0)
    }


def _declared(replica_sets: Mapping[str, int]) -> dict[str, int]:
    return {t: n for t, n in sorted(replica_sets.items()) if n > 0}


def create_or_update(
    builder: PlanBuilder,
    revisions: RevisionSource,
    usage: UsageView,
    cluster_id: str,
    *,
    divisible: bool,
    replica_sets: Mapping[str, int],
    revision: int,
    autoscaler: bool = False,
    must_exist: bool = False,
    launchable: Launchable = NO_AUTOSCALER,
) -> Cluster:
    """``autoscaler``: a move by the autoscaler (it must not take a template below the
    floor, and keeps the declared replica sets); otherwise the tenant's request, which
    becomes the declared replica sets.  ``must_exist``: the caller means update, so a
    missing cluster is NotFound (ant-ray creates it).  ``launchable``: what an embedded
    autoscaler could add (:mod:`~gcs.policy.virtual_clusters.launchable`)."""
    draft = builder.draft
    _validate_id(cluster_id, msg.PRIMARY_CREATE)
    if is_job_cluster_id(cluster_id):
        raise VcInvalidArgument(msg.id_has_separator(cluster_id))
    _validate_replica_sets(cluster_id, replica_sets)
    existing = draft.get(cluster_id)
    if must_exist and (existing is None or existing.kind is Kind.JOB):
        raise VcNotFound(msg.vc_does_not_exist(cluster_id))
    if existing is None and (problem := id_problem(cluster_id)) is not None:
        raise VcInvalidArgument(msg.invalid_id(problem))
    if existing is not None:
        if revision != existing.revision:
            raise VcInvalidArgument(msg.revision_expired(revision, cluster_id, existing.revision))
        if divisible != existing.divisible:
            raise VcInvalidArgument(msg.incompatible(cluster_id, existing.divisible, divisible))
    current = draft.replica_sets(existing) if existing else {}
    if existing is not None and autoscaler:
        short = _short_of_floor(existing, current, replica_sets)
        if short:
            raise VcUnsafeToRemove(msg.below_floor(cluster_id, short))
    to_remove = {
        t: c - replica_sets.get(t, 0) for t, c in current.items() if c > replica_sets.get(t, 0)
    }
    to_add = {
        t: n - current.get(t, 0)
        for t, n in replica_sets.items()
        if existing is None or n > current.get(t, 0)
    }
    removing: list[str] = []
    if existing is not None and to_remove:
        chosen, possible = _pick_shrink(draft, existing, to_remove, usage)
        if possible != to_remove:
            raise VcUnsafeToRemove(msg.NO_ENOUGH_TO_REMOVE, replica_sets_to_recommend=possible)
        removing = _flatten(chosen)
    primary = draft.primary()
    chosen, possible = _pick_grow(draft, primary, to_add)
    if possible != to_add:
        shortfall = {t: n - possible[t] for t, n in to_add.items() if n > possible[t]}
        _refuse_or_wait(draft, launchable, cluster_id, divisible, autoscaler, shortfall, possible)
    adding = _flatten(chosen)

    kind = Kind.DIVISIBLE if divisible else Kind.INDIVISIBLE
    base = existing or Cluster(id=cluster_id, kind=kind, revision=0)
    cluster = base.moved(
        add=dict.fromkeys(adding, UNDIVIDED),
        remove=removing,
        revision=revisions.next(),
        template=draft.template,
        declared=None if existing is not None and autoscaler else _declared(replica_sets),
    )
    draft.put(cluster)
    draft.put(
        primary.moved(
            add=dict.fromkeys(removing, UNDIVIDED),
            remove=adding,
            revision=revisions.next(),
            template=draft.template,
        )
    )
    builder.flush(cluster_id)
    return cluster


def _refuse_or_wait(
    draft: Draft,
    launchable: Launchable,
    cluster_id: str,
    divisible: bool,
    autoscaler: bool,
    shortfall: Mapping[str, int],
    possible: Mapping[str, int],
) -> None:
    """The free primary nodes fall short by ``shortfall``: OutOfResource (ant-ray's code,
    message and recommendation; an unknown node type named first), unless the tenant's
    indivisible cluster can wait for the embedded autoscaler to launch the rest."""
    known = known_templates(draft, launchable)
    unknown = sorted(t for t in shortfall if t not in known)
    if unknown:
        raise VcOutOfResource(
            f"{msg.unknown_node_types(unknown, known)} {msg.NO_ENOUGH_TO_ADD}",
            replica_sets_to_recommend=possible,
        )
    fillable = covers(draft, launchable, cluster_id, shortfall)
    if divisible and fillable and not autoscaler:
        raise VcOutOfResource(
            f"{msg.NO_ENOUGH_TO_ADD} {msg.AUTOSCALER_FILLS_INDIVISIBLE}",
            replica_sets_to_recommend=possible,
        )
    if autoscaler or divisible or not fillable:
        raise VcOutOfResource(msg.NO_ENOUGH_TO_ADD, replica_sets_to_recommend=possible)


def create_job_cluster(
    builder: PlanBuilder,
    revisions: RevisionSource,
    parent: str,
    job: str,
    replica_sets: Mapping[str, int],
) -> str:
    draft = builder.draft
    cluster = draft.get(parent) if parent else None
    if cluster is None:
        raise VcNotFound(msg.vc_not_exists(parent))
    if cluster.indivisible:
        raise VcInvalidArgument(msg.not_exclusive(parent))
    job_cluster_id = build_job_cluster_id(parent, job)
    if not job:
        raise VcInvalidArgument(msg.JOB_ID_EMPTY)
    if draft.get(job_cluster_id) is not None:
        raise VcInvalidArgument(msg.job_cluster_exists(job_cluster_id))
    _validate_replica_sets(job_cluster_id, replica_sets)
    chosen, possible = _pick_grow(draft, cluster, replica_sets)
    if possible != dict(replica_sets):
        raise VcOutOfResource(
            msg.no_enough_for_job(job_cluster_id), replica_sets_to_recommend=possible
        )
    nodes = _flatten(chosen)
    draft.put(
        cluster.moved(
            add=dict.fromkeys(nodes, job_cluster_id),
            revision=revisions.next(),
            template=draft.template,
        )
    )
    draft.put(
        Cluster(
            id=job_cluster_id,
            kind=Kind.JOB,
            revision=revisions.next(),
            members=dict.fromkeys(nodes, UNDIVIDED),
        )
    )
    builder.flush(job_cluster_id)
    builder.flush(parent)  # keeps the parent's revision durable (ant-ray skips this flush)
    return job_cluster_id


def remove_job_cluster(builder: PlanBuilder, revisions: RevisionSource, job: Cluster) -> None:
    """Unconditionally return a job cluster's nodes to its parent's undivided bucket."""
    draft = builder.draft
    parent = draft.get(job.parent_id)
    assert parent is not None
    draft.put(
        parent.moved(
            add=dict.fromkeys(job.members, UNDIVIDED),
            revision=revisions.next(),
            template=draft.template,
        )
    )
    draft.drop(job.id)
    builder.flush(parent.id)
    builder.flush_removed(job)


def remove_cluster(
    builder: PlanBuilder, revisions: RevisionSource, usage: UsageView, cluster_id: str
) -> None:
    draft = builder.draft
    _validate_id(cluster_id, msg.PRIMARY_REMOVE)
    if is_job_cluster_id(cluster_id):
        parent = draft.get(parent_id(cluster_id))
        if parent is None:
            raise VcNotFound(msg.remove_parent_missing(cluster_id))
        if parent.indivisible:
            raise VcInvalidArgument(msg.remove_parent_indivisible(cluster_id))
        job = draft.get(cluster_id)
        if job is not None and in_use(draft, job, usage):
            raise VcInvalid(msg.remove_job_in_use(cluster_id))
        if job is None:
            raise VcNotFound(msg.job_cluster_missing(cluster_id))
        remove_job_cluster(builder, revisions, job)
        return
    cluster = draft.get(cluster_id)
    if cluster is None:
        raise VcNotFound(msg.logical_missing(cluster_id))
    if in_use(draft, cluster, usage):
        raise VcUnsafeToRemove(msg.still_in_use(cluster_id))
    primary = draft.primary()
    draft.put(
        primary.moved(
            add=dict.fromkeys(cluster.members, UNDIVIDED),
            revision=revisions.next(),
            template=draft.template,
        )
    )
    draft.drop(cluster_id)
    builder.flush_removed(cluster)


def remove_nodes(
    builder: PlanBuilder,
    revisions: RevisionSource,
    usage: UsageView,
    cluster_id: str,
    node_ids: Iterable[str],
    *,
    revision: int = 0,
    autoscaler: bool = False,
) -> None:
    """All-or-nothing; the target gets a new revision (ant-ray keeps it, so an update at
    the old revision passed after nodes left), the primary's bumps.

    ``revision`` (non-zero): the caller's; it must still be the cluster's.  ``autoscaler``:
    a release, which keeps the declared replica sets and may not go below the floor; an
    operator's removal instead lowers the declared replica sets to what is left.  Nodes lent
    to a job cluster are not removable (ant-ray moves them and corrupts the job).
    """
    draft = builder.draft
    _validate_id(cluster_id, msg.PRIMARY_REMOVE_NODES)
    cluster = draft.get(cluster_id)
    if cluster is None or cluster.kind not in (Kind.DIVISIBLE, Kind.INDIVISIBLE):
        raise VcNotFound(msg.logical_missing(cluster_id))
    if revision and revision != cluster.revision:
        raise VcInvalidArgument(msg.revision_expired(revision, cluster_id, cluster.revision))
    wanted = list(dict.fromkeys(node_ids))
    failed = [
        n
        for n in wanted
        if cluster.members.get(n) != UNDIVIDED or not (draft.is_dead(n) or usage.is_node_idle(n))
    ]
    if failed:
        raise VcUnsafeToRemove(msg.REMOVE_NODES_FAILED, nodes_with_failure=failed)
    if autoscaler:
        # the floor is a reservation of usable nodes: alive ones are counted
        alive = Counter(draft.template(n) for n in cluster.members if not draft.is_dead(n))
        leaving = Counter(draft.template(n) for n in wanted if not draft.is_dead(n))
        short = _short_of_floor(cluster, alive, alive - leaving)
        if short:
            below = [n for n in wanted if draft.template(n) in short]
            raise VcUnsafeToRemove(msg.below_floor(cluster_id, short), nodes_with_failure=below)
        declared = cluster.declared
    else:
        left = Counter(draft.replica_sets(cluster)) - Counter(draft.template(n) for n in wanted)
        declared = _declared({t: min(n, left[t]) for t, n in cluster.declared.items()})
    draft.put(
        cluster.moved(
            remove=wanted,
            revision=revisions.next() if wanted else None,
            template=draft.template,
            declared=declared,
        )
    )
    primary = draft.primary()
    draft.put(
        primary.moved(
            add=dict.fromkeys(wanted, UNDIVIDED),
            revision=revisions.next(),
            template=draft.template,
        )
    )
    builder.flush(cluster_id)


def update_autoscaling_config(
    builder: PlanBuilder,
    cluster_id: str,
    min_replica_sets: Mapping[str, int],
    max_replica_sets: Mapping[str, int],
    max_nodes: int,
) -> None:
    draft = builder.draft
    _validate_id(cluster_id, msg.PRIMARY_AUTOSCALING)
    for group, high in max_replica_sets.items():
        if group not in min_replica_sets or min_replica_sets[group] > high:
            raise VcInvalidArgument(msg.min_max_mismatch(group))
    if sum(min_replica_sets.values()) > max_nodes:
        raise VcInvalidArgument(msg.MAX_NODES_TOO_SMALL)
    cluster = draft.get(cluster_id)
    if cluster is None or cluster.kind not in (Kind.DIVISIBLE, Kind.INDIVISIBLE):
        raise VcNotFound(msg.vc_does_not_exist(cluster_id))
    draft.put(
        replace(
            cluster,
            min_replica_sets=dict(min_replica_sets),
            max_replica_sets=dict(max_replica_sets),
            max_nodes=max_nodes,
        )
    )
    builder.flush(cluster_id)


def get_autoscaling_config(draft: Draft, cluster_id: str) -> Cluster:
    if not cluster_id:
        raise VcInvalidArgument(msg.ID_EMPTY)
    cluster = draft.get(cluster_id)
    if cluster is None or cluster.kind not in (Kind.DIVISIBLE, Kind.INDIVISIBLE):
        raise VcInvalidArgument(msg.AUTOSCALING_MISSING)
    return cluster
