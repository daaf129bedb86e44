"""Virtual-cluster-aware scaling (pure policy): what each indivisible virtual cluster needs
this round, and where it comes from.

For every indivisible logical cluster the GCS reports (``virtual_cluster_states``), the real
scheduler runs on that cluster alone: its member nodes, the launches already under way for
it, its pending demand, and its node types capped by its autoscaling config
(``min_replica_sets`` -> min_workers, ``max_replica_sets`` -> max_workers, ``max_nodes`` ->
max_num_nodes).  What the scheduler asks to launch is served, in this order, by:

1. the cluster's own free capacity (the scheduler already packs demand on its members);
2. free nodes of the primary cluster of that type, moved in (``VcGrow``, executed by the
   reconciler with CreateOrUpdateVirtualCluster at the current revision);
3. launches of that type (``VcLaunch``), tagged with the cluster so that, once they join the
   primary, the next round moves them in (step 2 again).

Idle members the scheduler would terminate are released to the primary instead
(``releases``), never below the cluster's floor: the GCS reports it as ``min_replica_sets``
(the autoscaling config's min where it names a type, else the replica sets the tenant
declared), so a reservation is kept while idle.  Divisible clusters and job clusters are not
scaled (as in ant-ray #579); their idle nodes are released only above the floor too
(:func:`within_floor`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gcs.autoscaler.cluster_state import PlanInputError, state_to_input
from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.instances.model import Instance, InstanceUpdate
from gcs.autoscaler.reconciler.inputs import node_instance
from gcs.policy.autoscaling.model import InstanceStatus, RayNode, RayNodeStatus
from gcs.policy.autoscaling.scheduler.types import (
    SCHEDULABLE_STATUSES,
    Decision,
    NodeInstance,
    SchedulerConfig,
    SchedulingInput,
    SchedulingReply,
    TerminationCause,
)
from gcs.policy.autoscaling.scheduler.waiting import WaitingDemand, WaitReason, in_cluster
from gcs.policy.virtual_clusters.ids import PRIMARY_CLUSTER_ID
from gcs.proto import autoscaler_pb2

Scheduler = Callable[[SchedulingInput], SchedulingReply]

#: Details of the QUEUED status of an instance launched for a virtual cluster (persisted with
#: the instance, so a restarted autoscaler still knows what the launch was for).
QUEUED_FOR = "queued for virtual cluster "
_IN_FLIGHT = frozenset(
    {
        InstanceStatus.QUEUED,
        InstanceStatus.REQUESTED,
        InstanceStatus.ALLOCATED,
        InstanceStatus.RAY_INSTALLING,
    }
)
_LIVE = (RayNodeStatus.RUNNING, RayNodeStatus.IDLE)


@dataclass(frozen=True, slots=True)
class VcGrow:
    """Move ``add`` (node type -> count) free primary nodes into ``cluster_id``."""

    cluster_id: str
    add: Mapping[str, int]
    reason: str


@dataclass(frozen=True, slots=True)
class VcLaunch:
    cluster_id: str
    node_type: str
    count: int
    reason: str


@dataclass(frozen=True, slots=True)
class VcPlan:
    grows: tuple[VcGrow, ...] = ()
    launches: tuple[VcLaunch, ...] = ()
    #: cluster id -> idle member nodes (hex) to give back to the primary.
    releases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Clusters this plan scales: the primary scheduler leaves their nodes alone.
    planned: frozenset[str] = frozenset()
    #: Member nodes (hex) of the planned clusters.
    held: frozenset[str] = frozenset()
    decisions: tuple[Decision, ...] = ()
    #: Why the planned clusters' demand waits, each entry naming its cluster.
    waiting: tuple[WaitingDemand, ...] = ()

    @property
    def launch_counts(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for launch in self.launches:
            out[launch.node_type] += launch.count
        return dict(out)


def destined_cluster(inst: Instance) -> str | None:
    """The virtual cluster an instance was launched for, or None."""
    for entry in inst.history:
        if entry.status is InstanceStatus.QUEUED and entry.details.startswith(QUEUED_FOR):
            return entry.details[len(QUEUED_FOR) :].split(":", 1)[0]
    return None


def queued_details(cluster_id: str, reason: str) -> str:
    return f"{QUEUED_FOR}{cluster_id}: {reason}"


def scalable_clusters(
    state: autoscaler_pb2.ClusterResourceState,
) -> dict[str, autoscaler_pb2.VirtualClusterState]:
    """Indivisible logical clusters (not the primary, not job clusters), by id."""
    return {
        cid: vc
        for cid, vc in sorted(state.virtual_cluster_states.items())
        if cid != PRIMARY_CLUSTER_ID and not vc.divisible and not vc.parent_virtual_cluster_id
    }


def _is_free(node: RayNode) -> bool:
    return (
        node.status in _LIVE
        and not node.is_head
        and all(node.available.get(k, 0.0) >= v for k, v in node.total.items())
    )


def free_primary_nodes(
    state: autoscaler_pb2.ClusterResourceState,
    nodes: Mapping[str, RayNode],
    instances: Mapping[str, Instance],
) -> dict[str, list[str]]:
    """Free (live, unused, not the head, not being stopped) primary nodes by type, lowest
    id first (the order the GCS hands them out in)."""
    stopping = {
        i.node_id
        for i in instances.values()
        if i.node_id and i.status is not InstanceStatus.RAY_RUNNING
    }
    primary = state.virtual_cluster_states.get(PRIMARY_CLUSTER_ID)
    pool: dict[str, list[str]] = defaultdict(list)
    if primary is None:
        return pool
    for node_id in sorted(primary.nodes):
        node = nodes.get(node_id)
        if node is not None and node.node_type and node_id not in stopping and _is_free(node):
            pool[node.node_type].append(node_id)
    return pool


def _cluster_config(
    cluster: ClusterConfig, vc: autoscaler_pb2.VirtualClusterState, member_types: set[str]
) -> SchedulerConfig:
    """The cluster's node types the VC names (members, min, max), capped by its config."""
    base = cluster.scheduler
    named = member_types | set(vc.min_replica_sets) | set(vc.max_replica_sets)
    types = {}
    for name in sorted(named):
        spec = base.node_types.get(name)
        if spec is None or name == cluster.head_node_type:
            continue
        cap = vc.max_replica_sets.get(name, spec.max_workers)
        types[name] = replace(
            spec,
            min_workers=min(vc.min_replica_sets.get(name, 0), cap),
            max_workers=min(cap, spec.max_workers),
        )
    return replace(base, node_types=types, max_num_nodes=vc.max_nodes or None)


def _demand(
    vc: autoscaler_pb2.VirtualClusterState, cluster: ClusterConfig, now_s: float
) -> SchedulingInput:
    only = autoscaler_pb2.ClusterResourceState(
        pending_resource_requests=vc.pending_resource_requests,
        pending_gang_resource_requests=vc.pending_gang_resource_requests,
    )
    return state_to_input(only, cluster, now_s)


def _member(node: RayNode, by_node: Mapping[str, Instance]) -> NodeInstance:
    inst = by_node.get(node.node_id)
    return node_instance(
        node, inst.instance_id if inst else f"ray:{node.node_id}", InstanceStatus.RAY_RUNNING, inst
    )


def plan_virtual_clusters(
    state: autoscaler_pb2.ClusterResourceState,
    instances: Mapping[str, Instance],
    ray_nodes: Sequence[RayNode],
    cluster: ClusterConfig,
    now_s: float,
    scheduler: Scheduler,
) -> VcPlan:
    clusters = scalable_clusters(state)
    if not clusters:
        return VcPlan()
    nodes = {n.node_id: n for n in ray_nodes}
    by_node = {i.node_id: i for i in instances.values() if i.node_id}
    pool = free_primary_nodes(state, nodes, instances)
    in_flight: dict[str, list[Instance]] = defaultdict(list)
    for inst in instances.values():
        if inst.status in _IN_FLIGHT and (target := destined_cluster(inst)) is not None:
            in_flight[target].append(inst)
    room = _cluster_room(cluster, instances)

    grows: list[VcGrow] = []
    launches: list[VcLaunch] = []
    releases: dict[str, tuple[str, ...]] = {}
    decisions: list[Decision] = []
    waiting: list[WaitingDemand] = []
    held: set[str] = set()
    for cid, vc in clusters.items():
        members = [nodes[n] for n in vc.nodes if n in nodes and nodes[n].status in _LIVE]
        held.update(vc.nodes)
        cfg = _cluster_config(cluster, vc, {m.node_type for m in members})
        try:
            demand = _demand(vc, cluster, now_s)
        except PlanInputError as err:
            decisions.append(Decision("skip", cid, f"bad demand: {err}"))
            continue
        pending = [
            NodeInstance(instance_id=i.instance_id, node_type=i.instance_type, status=i.status)
            for i in sorted(in_flight.get(cid, ()), key=lambda i: i.instance_id)
            if i.instance_type in cfg.node_types
        ]
        inp = SchedulingInput(
            config=cfg,
            instances=(*(_member(m, by_node) for m in members), *pending),
            demands=demand.demands,
            gangs=demand.gangs,
            now_s=now_s,
        )
        reply = scheduler(inp)
        idle = _releasable(vc, members, reply, nodes)
        if idle:
            releases[cid] = idle
        add: dict[str, int] = {}
        have = Counter(m.node_type for m in members) + Counter(p.node_type for p in pending)
        room_total = vc.max_nodes - sum(have.values()) if vc.max_nodes else 1 << 30
        capped: dict[str, str] = {}
        for node_type, wanted in reply.launches.items():
            # the scheduler can ask past the caps (min_workers first, then the excess goes):
            # a VC never grows past max_nodes or its type's max.
            cap = vc.max_replica_sets.get(node_type)
            count = min(wanted, room_total, (cap - have[node_type]) if cap is not None else wanted)
            count = max(0, count)
            if count < wanted:
                why = (
                    f"{wanted - count} x {node_type} not added: max_nodes {vc.max_nodes}, "
                    f"max {node_type} {cap if cap is not None else '-'}"
                )
                capped[node_type] = why
                decisions.append(Decision("capped", cid, why))
            room_total -= count
            take = min(count, len(pool.get(node_type, ())))
            if take:
                del pool[node_type][:take]
                add[node_type] = take
            rest = min(count - take, room.get(node_type, 0), room[""])
            if rest:
                room[node_type] -= rest
                room[""] -= rest
                launches.append(VcLaunch(cid, node_type, rest, f"no free primary {node_type} node"))
            if count - take - rest > 0:
                why = (
                    f"{count - take - rest} x {node_type} not launched: the cluster's "
                    "max_workers is reached"
                )
                capped.setdefault(node_type, why)
                decisions.append(Decision("capped", cid, why))
        if add:
            what = ", ".join(f"{n} x {t}" for t, n in add.items())
            grows.append(VcGrow(cid, add, f"move {what} free primary node(s) for pending demand"))
        decisions.extend(
            Decision(d.action, f"{cid}/{d.subject}", d.reason)
            for d in reply.reasons
            if d.action in ("capped", "infeasible", "skip")
        )
        waiting.extend(in_cluster(_recap(reply.waiting, capped), cid))
    return VcPlan(
        grows=tuple(grows),
        launches=tuple(launches),
        releases=releases,
        planned=frozenset(clusters),
        held=frozenset(held),
        decisions=tuple(decisions),
        waiting=tuple(waiting),
    )


def waiting_demand(primary: SchedulingReply, plan: VcPlan) -> tuple[WaitingDemand, ...]:
    """Why demand waits, cluster-wide: the primary's scheduler for the demand no planned
    virtual cluster claims, each planned cluster's own for its demand."""
    return (*primary.waiting, *plan.waiting)


def _recap(items: Sequence[WaitingDemand], capped: Mapping[str, str]) -> list[WaitingDemand]:
    """Demand the cluster's scheduler placed on a new node of a type the virtual cluster
    (or the cluster) then could not add waits on that limit, not on the node."""
    out = []
    for item in items:
        hit = next((t for t in capped if f" x {t} being added" in item.why), None)
        if item.reason is WaitReason.PENDING_CAPACITY and hit is not None:
            head = item.why.split(" wait ", 1)[0]
            out.append(replace(item, reason=WaitReason.CAPPED, why=f"{head}: {capped[hit]}"))
        else:
            out.append(item)
    return out


def _above_floor(
    vc: autoscaler_pb2.VirtualClusterState, left: Counter[str], candidates: Sequence[RayNode]
) -> tuple[str, ...]:
    """``candidates`` in order, as long as each type keeps the cluster's floor
    (``min_replica_sets``) of the ``left`` nodes it counts (updated)."""
    out = []
    for node in candidates:
        if left[node.node_type] - 1 < vc.min_replica_sets.get(node.node_type, 0):
            continue
        left[node.node_type] -= 1
        out.append(node.node_id)
    return tuple(out)


def _releasable(
    vc: autoscaler_pb2.VirtualClusterState,
    members: Sequence[RayNode],
    reply: SchedulingReply,
    nodes: Mapping[str, RayNode],
) -> tuple[str, ...]:
    """Members the scheduler would terminate that are idle, in its order, above the floor
    (the scheduler's max enforcement ignores mins)."""
    member_ids = {m.node_id for m in members}
    idle = [
        nodes[t.ray_node_id]
        for t in reply.terminations
        if t.ray_node_id in member_ids
        and (t.cause is TerminationCause.IDLE or nodes[t.ray_node_id].status is RayNodeStatus.IDLE)
    ]
    return _above_floor(vc, Counter(m.node_type for m in members), idle)


def within_floor(
    state: autoscaler_pb2.ClusterResourceState,
    releases: Mapping[str, Sequence[str]],
    ray_nodes: Sequence[RayNode],
) -> dict[str, list[str]]:
    """``releases`` (cluster id -> nodes) trimmed so that no cluster goes below its floor,
    counting the nodes the GCS lists for it (undivided ones for a divisible cluster, which
    errs toward keeping)."""
    nodes = {n.node_id: n for n in ray_nodes}
    out: dict[str, list[str]] = {}
    for cluster_id, node_ids in releases.items():
        vc = state.virtual_cluster_states.get(cluster_id)
        if vc is None:
            continue
        left = Counter(nodes[n].node_type for n in vc.nodes if n in nodes)
        kept = _above_floor(vc, left, [nodes[n] for n in node_ids if n in nodes])
        if kept:
            out[cluster_id] = list(kept)
    return out


def _cluster_room(cluster: ClusterConfig, instances: Mapping[str, Instance]) -> dict[str, int]:
    """How many more nodes of each type (and, under "", in all) the cluster config allows."""
    count: Counter[str] = Counter(
        i.instance_type for i in instances.values() if i.status in SCHEDULABLE_STATUSES
    )
    cap = cluster.scheduler.max_num_nodes
    room = {
        name: max(0, spec.max_workers - count[name])
        for name, spec in cluster.scheduler.node_types.items()
    }
    room[""] = max(0, cap - sum(count.values())) if cap is not None else 1 << 30
    return room


def primary_demand(
    state: autoscaler_pb2.ClusterResourceState, planned: frozenset[str]
) -> autoscaler_pb2.ClusterResourceState:
    """``state`` whose cluster-level demand no longer counts what the planned clusters ask
    for (the GCS reports a VC's demand both per VC and in the cluster-wide sum)."""
    if not planned:
        return state
    minus: Counter[bytes] = Counter()
    gangs: Counter[bytes] = Counter()
    for cid in planned:
        vc = state.virtual_cluster_states[cid]
        for rc in vc.pending_resource_requests:
            minus[rc.request.SerializeToString(deterministic=True)] += rc.count
        for g in vc.pending_gang_resource_requests:
            gangs[g.SerializeToString(deterministic=True)] += 1
    if not minus and not gangs:
        return state
    out = autoscaler_pb2.ClusterResourceState()
    out.CopyFrom(state)
    del out.pending_resource_requests[:]
    for rc in state.pending_resource_requests:
        key = rc.request.SerializeToString(deterministic=True)
        taken = min(rc.count, minus[key])
        minus[key] -= taken
        if rc.count - taken > 0:
            out.pending_resource_requests.add(request=rc.request, count=rc.count - taken)
    del out.pending_gang_resource_requests[:]
    for g in state.pending_gang_resource_requests:
        key = g.SerializeToString(deterministic=True)
        if gangs[key] > 0:
            gangs[key] -= 1
            continue
        out.pending_gang_resource_requests.add().CopyFrom(g)
    return out


def launch_updates(launches: Sequence[VcLaunch], new_id: Callable[[], str]) -> list[InstanceUpdate]:
    """QUEUED instances for the virtual clusters' launches, each tagged with its cluster."""
    return [
        InstanceUpdate(
            new_id(),
            InstanceStatus.QUEUED,
            upsert=True,
            instance_type=launch.node_type,
            details=queued_details(launch.cluster_id, launch.reason),
        )
        for launch in launches
        for _ in range(launch.count)
    ]


def hide_held_capacity(inp: SchedulingInput, held: frozenset[str]) -> SchedulingInput:
    """The primary's scheduler may count nodes of a scaled virtual cluster toward the caps,
    but never places primary demand on them."""
    if not held:
        return inp
    return replace(
        inp,
        instances=tuple(
            replace(n, available={}) if n.ray_node_id in held else n for n in inp.instances
        ),
    )
