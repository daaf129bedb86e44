"""What an embedded autoscaler could add, as the virtual-cluster model sees it (pure).

A tenant's CreateOrUpdate that the free primary nodes cannot satisfy is refused
(OutOfResource, ant-ray).  With an embedded autoscaler that may launch the missing nodes
within its limits, the request is accepted instead: the cluster gets the free nodes there
are, declares the whole request, and its floor (the declared replica sets, reported as
``min_replica_sets``) makes the autoscaler launch the rest and move it in
(:mod:`gcs.autoscaler.reconciler.vc_scaling`, which scales indivisible clusters only: a
divisible cluster short of nodes is still refused).

Room per node type = its ``max_workers`` - the alive nodes of that type - what the other
indivisible clusters already wait for (their floor minus their alive members).  The GCS
does not see launches under way for other demand, so the figure errs toward accepting; the
autoscaler's caps still hold, and its events say when a cluster waits on one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from gcs.policy.virtual_clusters.model import Draft, Kind, counted_members, floor


@dataclass(frozen=True)
class Launchable:
    """The embedded autoscaler's limits, ``NO_AUTOSCALER`` when none runs."""

    max_workers: Mapping[str, int] = field(default_factory=dict)
    """Worker node type -> its ``max_workers`` (the head's type left out)."""
    max_nodes: int | None = None
    """The cluster's node cap, the head included (``max_num_nodes``); None = no cap."""


NO_AUTOSCALER = Launchable()


def known_templates(draft: Draft, launchable: Launchable) -> list[str]:
    """Node types a request may name: of a node that joined (dead ones too), or one the
    autoscaler can launch."""
    seen = {node.template_id for node in draft.nodes() if node.template_id}
    return sorted(seen | set(launchable.max_workers))


def covers(
    draft: Draft, launchable: Launchable, cluster_id: str, shortfall: Mapping[str, int]
) -> bool:
    """Whether the autoscaler may launch ``shortfall`` (type -> nodes) for ``cluster_id``
    on top of what the other indivisible clusters already wait for."""
    if not shortfall or not launchable.max_workers:
        return False
    alive: Counter[str] = Counter(node.template_id for node in draft.nodes() if not node.is_dead)
    waiting: Counter[str] = Counter()
    for cluster in draft.logical():
        if cluster.kind is not Kind.INDIVISIBLE or cluster.id == cluster_id:
            continue
        members = Counter(draft.template(n) for n in counted_members(cluster, draft.node))
        for template, count in floor(cluster).items():
            waiting[template] += max(0, count - members[template])
    for template, count in shortfall.items():
        cap = launchable.max_workers.get(template)
        if cap is None or cap - alive[template] - waiting[template] < count:
            return False
    if launchable.max_nodes is None:
        return True
    room = launchable.max_nodes - sum(alive.values()) - sum(waiting.values())
    return room >= sum(shortfall.values())
