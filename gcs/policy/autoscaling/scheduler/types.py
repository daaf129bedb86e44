"""Scheduler input and output: frozen dataclasses, no behaviour.

The bottom of the scheduler: this module imports no other scheduler module (every other
one may import it), so the package has no import circle (``tests/autoscaler/test_layers.py``).

Demand stays grouped as (shape, selectors, constraint, count); the scheduler never
expands a count into that many objects.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gcs.policy.autoscaling.model import InstanceStatus, NodeKind

IMPLICIT_RESOURCE_PREFIX = "node:__internal_implicit_resource_"


#: Statuses from which RAY_RUNNING is still reachable: these nodes take part in scheduling.
SCHEDULABLE_STATUSES = frozenset(
    {
        InstanceStatus.QUEUED,
        InstanceStatus.REQUESTED,
        InstanceStatus.ALLOCATED,
        InstanceStatus.RAY_INSTALLING,
        InstanceStatus.RAY_RUNNING,
        InstanceStatus.RAY_STOP_REQUESTED,
    }
)
#: Pending statuses governed by the pending-node idle timeout (REQUESTED cannot be cancelled).
PENDING_TERMINABLE_STATUSES = frozenset(
    {InstanceStatus.QUEUED, InstanceStatus.ALLOCATED, InstanceStatus.RAY_INSTALLING}
)


class LabelOp(enum.Enum):
    IN = "in"
    NOT_IN = "not_in"
    EXISTS = "exists"
    DOES_NOT_EXIST = "does_not_exist"


class TerminationCause(enum.Enum):
    IDLE = "IDLE"
    MAX_NUM_NODES = "MAX_NUM_NODES"
    MAX_NUM_NODE_PER_TYPE = "MAX_NUM_NODE_PER_TYPE"
    OUTDATED = "OUTDATED"


@dataclass(frozen=True)
class LabelConstraint:
    key: str
    op: LabelOp
    values: tuple[str, ...] = ()


#: All constraints of a selector must hold; a request's selectors are alternatives,
#: earlier ones preferred.
LabelSelector = tuple[LabelConstraint, ...]


@dataclass(frozen=True)
class ResourceDemand:
    """``count`` identical requests for one bundle (a task/actor shape or a PG bundle)."""

    resources: Mapping[str, float]
    count: int = 1
    selectors: tuple[LabelSelector, ...] = ()
    #: (label name, label value): bundles of one STRICT_PACK group.
    affinity: tuple[str, str] | None = None
    #: (label name, label value): bundles of one STRICT_SPREAD group.
    anti_affinity: tuple[str, str] | None = None


@dataclass(frozen=True)
class GangRequest:
    """A placement group: all bundles place or none do."""

    bundles: tuple[ResourceDemand, ...]
    details: str = ""
    #: Fallback bundle lists, tried in order when ``fallbacks_enabled`` (Ray 2.60 ignores them).
    fallbacks: tuple[tuple[ResourceDemand, ...], ...] = ()
    #: "PACK" | "SPREAD" | "STRICT_PACK" | "STRICT_SPREAD" ("" = unknown).
    strategy: str = ""
    #: The group lost bundles to a dead node; ``bundles`` lists only the lost ones.
    rescheduling: bool = False
    #: Instance or Ray node ids holding the surviving bundles, when known. Nodes labelled with
    #: the group's ``_PG_<id>`` label are survivors too.
    survivor_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterConstraint:
    """``request_resources``: capacity the cluster must have (packed against totals)."""

    bundles: tuple[ResourceDemand, ...]


@dataclass(frozen=True)
class IpprSpec:
    """KubeRay in-place pod resize bounds of one node type (the ``ray.io/ippr`` group entry).

    CPU in cores, memory in bytes. ``min_*`` are the pod template's size (informational:
    the scheduler never shrinks a pod), ``max_*`` the most a pod may be resized to.
    """

    max_cpu: float
    max_memory: float
    min_cpu: float = 0.0
    min_memory: float = 0.0
    resize_timeout_s: int = 0


@dataclass(frozen=True)
class IpprStatus:
    """One pod's resize state (the ``ray.io/ippr-status`` annotation plus pod conditions).

    ``desired_*`` default to ``current_*`` (no resize asked). ``k8s_resize_status`` is None
    when Kubernetes has nothing in flight, "new" for a resize queued but not sent yet,
    else the lower-cased condition ("inprogress", "deferred", "infeasible", "error").
    """

    current_cpu: float
    current_memory: float
    desired_cpu: float | None = None
    desired_memory: float | None = None
    #: Unix seconds when a resize was sent to Kubernetes; None once Ray has been synced.
    resizing_at: float | None = None
    k8s_resize_status: str | None = None
    #: Caps learned from a deferred / infeasible resize; they win over the spec's max.
    suggested_max_cpu: float | None = None
    suggested_max_memory: float | None = None
    #: Set after a failed or timed-out resize: the pod is never resized up again.
    last_failed_at: float | None = None
    last_failed_reason: str | None = None
    #: Raylet on the pod ("" = unknown; a running node's own id takes precedence).
    raylet_id: str = ""

    def __post_init__(self) -> None:
        if self.desired_cpu is None:
            object.__setattr__(self, "desired_cpu", self.current_cpu)
        if self.desired_memory is None:
            object.__setattr__(self, "desired_memory", self.current_memory)

    def max_cpu(self, spec: IpprSpec) -> float:
        return spec.max_cpu if self.suggested_max_cpu is None else self.suggested_max_cpu

    def max_memory(self, spec: IpprSpec) -> float:
        return spec.max_memory if self.suggested_max_memory is None else self.suggested_max_memory

    def has_resize_to_send(self) -> bool:
        return bool(self.raylet_id) and self.k8s_resize_status == "new"

    def is_in_progress(self) -> bool:
        """Sent and not yet synced to the raylet, or queued to send."""
        return self.resizing_at is not None or self.has_resize_to_send()

    def can_resize_up(self, spec: IpprSpec) -> bool:
        return (
            self.last_failed_at is None
            and self.k8s_resize_status is None
            and self.resizing_at is None
            and (
                self.current_cpu < self.max_cpu(spec) or self.current_memory < self.max_memory(spec)
            )
        )


@dataclass(frozen=True)
class NodeTypeConfig:
    name: str
    resources: Mapping[str, float]
    min_workers: int = 0
    #: Ray's max_worker_nodes (already +1 for the head type when built from a cluster YAML).
    max_workers: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    priority: int = 0
    idle_timeout_s: float | None = None
    launch_config_hash: str = ""
    #: In-place pod resize bounds; None = pods of this type are never resized.
    ippr: IpprSpec | None = None


@dataclass(frozen=True)
class Options:
    """Behaviour beyond Ray 2.60; each is off by default."""

    #: Per-node idle clock reset only by work landing on that node (ray#60546).
    own_idle_clock: bool = False
    #: With no running worker, release the whole first batch at once (ray#54699).
    cold_start_full_batch: bool = False
    #: Try a gang's fallback bundle selectors in order when the primary does not fit.
    gang_fallbacks: bool = False
    #: At most this many nodes leaving at once: idle termination stops when the nodes
    #: already leaving (earlier rounds' drains, this round's outdated and over-max
    #: terminations, which it never holds back) and its own reach it; None = unlimited.
    disruption_budget_nodes: int | None = None
    #: Same as a percentage of the non-head nodes, leaving ones included (rounded down,
    #: at least 1).
    disruption_budget_percent: float | None = None
    #: Nodes carrying this label with value "true" are never idle-terminated (a voluntary
    #: disruption); max_workers and max_num_nodes are hard limits and still apply to them.
    do_not_disrupt_label: str | None = None
    #: Node types whose launch failed less than this long ago are not picked for launches.
    unavailable_type_ttl_s: float | None = None
    #: Ray's AUTOSCALER_CONSERVE_GPU_NODES.
    conserve_gpu_nodes: bool = True
    #: A RESCHEDULING group's lost bundles honour its strategy relative to the nodes holding
    #: the surviving bundles (ray#40212): STRICT_PACK only on those nodes, STRICT_SPREAD never.
    lost_bundle_replacement: bool = False
    #: Work cap per round (Karpenter keeps a deadline; ours counts, so a round stays
    #: deterministic).  Packing one request shape or one gang bundle costs about one look
    #: at each node, so a round packs at most ``max_work_units / nodes`` shapes and as many
    #: gang bundles; the rest waits for the next round (a ``deferred`` decision says so).
    #: Demand is grouped by shape, so counts never add work.  The default keeps a round near
    #: a second at 10,000 nodes whatever the input (200 distinct shapes there; real clusters
    #: have a handful).
    max_work_units: int = 2_000_000
    max_constraints: int = 100


@dataclass(frozen=True)
class SchedulerConfig:
    node_types: Mapping[str, NodeTypeConfig]
    #: Cluster node cap including the head; None = uncapped.
    max_num_nodes: int | None = None
    idle_timeout_s: float | None = None
    pending_idle_timeout_s: float | None = None
    disable_launch_config_check: bool = False
    options: Options = Options()


@dataclass(frozen=True)
class NodeInstance:
    """One instance: a pending launch or a node running Ray."""

    instance_id: str
    node_type: str
    status: InstanceStatus = InstanceStatus.RAY_RUNNING
    kind: NodeKind = NodeKind.WORKER
    #: Hex Ray node id, "" while Ray is not running there.
    ray_node_id: str = ""
    #: Ignored unless RAY_RUNNING (pending nodes take the type's resources).
    total: Mapping[str, float] = field(default_factory=dict)
    available: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    idle_duration_ms: int = 0
    launch_config_hash: str = ""
    cloud_instance_id: str = ""
    #: Resize state of this pod; used only when its node type has an ``ippr`` spec.
    ippr: IpprStatus | None = None


@dataclass(frozen=True)
class LaunchFailure:
    node_type: str
    at_s: float


@dataclass(frozen=True)
class SchedulingInput:
    config: SchedulerConfig
    instances: tuple[NodeInstance, ...] = ()
    demands: tuple[ResourceDemand, ...] = ()
    gangs: tuple[GangRequest, ...] = ()
    constraints: tuple[ClusterConstraint, ...] = ()
    cloud_availability: Mapping[str, float] = field(default_factory=dict)
    recoverable_availability: Mapping[str, float] = field(default_factory=dict)
    #: Wall time of the round in seconds; used only by the beyond-Ray options.
    now_s: float = 0.0
    #: Recent launch failures (feed of the unavailable-type cache).
    launch_failures: tuple[LaunchFailure, ...] = ()
    #: Node types the caller's unavailable-capacity cache holds back this round, with why
    #: (e.g. "unavailable for 50 s more: capacity exhausted"); never launched, so demand
    #: falls back to the next type that fits.
    unavailable_types: Mapping[str, str] = field(default_factory=dict)
    #: own_idle_clock: when work last landed on each instance (from the previous reply).
    last_work_s: Mapping[str, float] = field(default_factory=dict)
    #: Pending-idle clocks per node type (from the previous reply; Ray keeps them in memory).
    pending_since_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Termination:
    instance_id: str
    ray_node_id: str
    node_type: str
    cause: TerminationCause
    instance_status: InstanceStatus
    reason: str
    idle_duration_ms: int = 0


@dataclass(frozen=True)
class Decision:
    """A human-readable reason; ``subject`` is a node type or instance id; ``detail`` the
    raw numbers behind it (``gcs autoscaler plan -v``)."""

    action: str
    subject: str
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class Resize:
    """Resize a pod in place to ``cpu`` cores / ``memory`` bytes (both dims, as Ray does)."""

    instance_id: str
    cloud_instance_id: str
    ray_node_id: str
    node_type: str
    cpu: float
    memory: float
    current_cpu: float
    current_memory: float
    reason: str


class WaitReason(enum.Enum):
    """Why a piece of unplaced demand waits (:mod:`~gcs.policy.autoscaling.scheduler.waiting`)."""

    INFEASIBLE = "infeasible"
    CAPPED = "capped"
    PENDING_CAPACITY = "pending-capacity"


class WaitKind(enum.Enum):
    TASKS = "tasks"  # task / actor requests (grouped by shape)
    PLACEMENT_GROUP = "placement-group"
    CONSTRAINT = "constraint"  # request_resources()


@dataclass(frozen=True, slots=True)
class WaitingDemand:
    """``count`` requests of ``resources`` (for a gang or a constraint: its largest bundle
    shape) that wait, and why."""

    kind: WaitKind
    resources: Mapping[str, float]
    count: int
    reason: WaitReason
    why: str
    cluster_id: str = ""
    #: Placement-group details (its id and strategy), "" for tasks.
    details: str = ""
    #: The requests' label selectors (alternatives), as the scheduler read them.
    selectors: tuple[LabelSelector, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind.value,
            "resources": dict(self.resources),
            "count": self.count,
            "reason": self.reason.value,
            "why": self.why,
        }
        if self.cluster_id:
            out["virtual_cluster"] = self.cluster_id
        if self.details:
            out["details"] = self.details
        if self.selectors:
            out["label_selectors"] = [
                [[c.key, c.op.value, list(c.values)] for c in sel] for sel in self.selectors
            ]
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WaitingDemand:
        """One entry as :meth:`to_json` wrote it; ``ValueError`` / ``KeyError`` /
        ``TypeError`` on anything else."""
        return cls(
            kind=WaitKind(raw["kind"]),
            resources={str(k): float(v) for k, v in dict(raw["resources"]).items()},
            count=int(raw["count"]),
            reason=WaitReason(raw["reason"]),
            why=str(raw["why"]),
            cluster_id=str(raw.get("virtual_cluster", "")),
            details=str(raw.get("details", "")),
            selectors=tuple(
                tuple(LabelConstraint(str(k), LabelOp(op), tuple(map(str, v))) for k, op, v in sel)
                for sel in raw.get("label_selectors", ())
            ),
        )


@dataclass(frozen=True)
class SchedulingReply:
    #: Node type -> count, in Ray's order of first appearance.
    launches: Mapping[str, int]
    terminations: tuple[Termination, ...]
    infeasible_demands: tuple[ResourceDemand, ...]
    infeasible_gangs: tuple[GangRequest, ...]
    infeasible_constraints: tuple[ClusterConstraint, ...]
    cluster_resources: Mapping[str, float]
    reasons: tuple[Decision, ...]
    #: Node types released at once despite upscaling_speed (cold_start_full_batch).
    launch_now_types: tuple[str, ...] = ()
    #: Carry into the next round's input (own_idle_clock / pending idle).
    last_work_s: Mapping[str, float] = field(default_factory=dict)
    pending_since_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    #: Node types skipped because a launch failed within the TTL.
    unavailable_types: tuple[str, ...] = ()
    #: In-place pod resizes to send (Ray's ``to_ippr``).
    resizes: tuple[Resize, ...] = ()
    #: Why each piece of unplaced demand waits (:mod:`~gcs.policy.autoscaling.scheduler.waiting`):
    #: the infeasible lists above keep Ray's meaning (a limit counts), this tells them apart.
    waiting: tuple[WaitingDemand, ...] = ()
