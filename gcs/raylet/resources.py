"""Local resource accounting of one raylet: pure policy, no I/O, no clock reads.

A lease asks for a resource *shape* (and optionally a label selector).  On arrival it is

* **granted** when the shape fits what is available now (and no older request of the
  same node is waiting: grants are FIFO),
* **queued** (ready, waiting for resources) when it fits the node's totals but not what is
  available now,
* **infeasible** when it can never run here: the shape exceeds the totals, names a resource
  the node does not have, or the selector does not match the node's labels.

Freeing a lease (or resizing the node) grants queued requests in FIFO order and re-checks
infeasible ones.  :meth:`LocalResources.load` summarises the queues the way a raylet reports
them in ``ResourcesData.resource_load_by_shape``.

Placement-group bundles (Ray's two-phase reservation): :meth:`~LocalResources.prepare_bundles`
holds a bundle's unit resources (all bundles of the call or none);
:meth:`~LocalResources.commit_bundles` turns held bundles into Ray's bundle resources
(:mod:`gcs.policy.placement.naming`), which leases can ask for;
:meth:`~LocalResources.return_bundle`
gives a prepared or committed bundle back (leases holding its resources are evicted first,
as Ray kills the bundle's workers).  A node holding bundles is busy.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gcs.base.changes import Changes
from gcs.base.errors import InvalidArgument, NotFound
from gcs.policy.placement.naming import BundleKey, bundle_resources

EPSILON = 1e-9

UNIT_INSTANCE_RESOURCES = frozenset({"GPU", "TPU", "NPU", "HPU", "RBLN", "neuron_cores"})
"""Resources Ray allocates as whole unit instances; a raylet refuses to resize them."""

LabelConstraint = tuple[str, int, tuple[str, ...]]
"""(label key, LabelSelectorOperator number: IN=1 / NOT_IN=2, values)."""

LABEL_IN = 1
LABEL_NOT_IN = 2


class Placement(enum.Enum):
    GRANTED = "granted"
    QUEUED = "queued"
    INFEASIBLE = "infeasible"


@dataclass(frozen=True)
class LeaseRequest:
    """What a lease asks for; ``lease_id`` identifies it for return and cancel."""

    lease_id: bytes
    shape: Mapping[str, float]
    selector: tuple[LabelConstraint, ...] = ()
    backlog_size: int = 0
    #: The job that asked (``LeaseSpec.job_id``; b"" = unknown).
    job_id: bytes = b""


@dataclass(frozen=True)
class Demand:
    """One ``ResourceDemand`` row: queued requests of one (shape, selector, job)."""

    shape: dict[str, float]
    selector: tuple[LabelConstraint, ...]
    ready: int = 0
    infeasible: int = 0
    backlog_size: int = 0
    job_id: bytes = b""


@dataclass
class _Entry:
    request: LeaseRequest
    state: Placement


def _fits(shape: Mapping[str, float], pool: Mapping[str, float]) -> bool:
    return all(pool.get(name, 0.0) + EPSILON >= amount for name, amount in shape.items())


def selector_matches(selector: Iterable[LabelConstraint], labels: Mapping[str, str]) -> bool:
    """IN: the node has the key with one of the values; NOT_IN: it has none of them."""
    for key, op, values in selector:
        value = labels.get(key)
        if op == LABEL_IN and value not in values:
            return False
        if op == LABEL_NOT_IN and value in values:
            return False
    return True


@dataclass
class _Bundle:
    unit: dict[str, float]
    committed: bool = False


@dataclass
class LocalResources:
    """Totals, availability and the lease queues of one node."""

    total: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)
    available: dict[str, float] = field(init=False)
    _granted: dict[bytes, LeaseRequest] = field(init=False, default_factory=dict)
    _waiting: deque[_Entry] = field(init=False, default_factory=deque)
    _bundles: dict[BundleKey, _Bundle] = field(init=False, default_factory=dict)
    changes: Changes = field(init=False, default_factory=Changes, repr=False)
    """Notified after every change (leases queued, granted, freed; totals; bundles)."""

    def __post_init__(self) -> None:
        self.total = {k: float(v) for k, v in self.total.items() if v > 0}
        self.available = dict(self.total)

    # -- queries -------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A node is busy while any lease or bundle holds resources (queued demand alone
        is not)."""
        return bool(self._granted) or bool(self._bundles)

    def bundles(self) -> dict[BundleKey, bool]:
        """Bundles held here -> committed (False: prepared only)."""
        return {key: b.committed for key, b in self._bundles.items()}

    def granted_ids(self) -> list[bytes]:
        return list(self._granted)

    def granted_request(self, lease_id: bytes) -> LeaseRequest:
        return self._granted[lease_id]

    def state_of(self, lease_id: bytes) -> Placement | None:
        if lease_id in self._granted:
            return Placement.GRANTED
        for entry in self._waiting:
            if entry.request.lease_id == lease_id:
                return entry.state
        return None

    def feasible(self, request: LeaseRequest) -> bool:
        return selector_matches(request.selector, self.labels) and _fits(request.shape, self.total)

    def load(self) -> tuple[dict[str, float], list[Demand]]:
        """(sum of queued shapes, one row per (shape, selector, job) in first-seen order).

        Rows name their job (beyond Ray, whose rows are per shape only), so the GCS books
        demand to a virtual cluster only when the job that queued it runs in one."""
        summed: dict[str, float] = {}
        rows: dict[
            tuple[tuple[tuple[str, float], ...], tuple[LabelConstraint, ...], bytes], Demand
        ] = {}
        for entry in self._waiting:
            req = entry.request
            for name, amount in req.shape.items():
                summed[name] = summed.get(name, 0.0) + amount
            key = (tuple(sorted(req.shape.items())), req.selector, req.job_id)
            row = rows.get(key) or Demand(
                shape=dict(req.shape), selector=req.selector, job_id=req.job_id
            )
            rows[key] = Demand(
                shape=row.shape,
                selector=row.selector,
                ready=row.ready + (entry.state is Placement.QUEUED),
                infeasible=row.infeasible + (entry.state is Placement.INFEASIBLE),
                backlog_size=row.backlog_size + req.backlog_size,
                job_id=row.job_id,
            )
        return summed, list(rows.values())

    # -- changes -------------------------------------------------------------------------

    def submit(self, request: LeaseRequest) -> Placement:
        """Place a new request; the caller learns of later grants from :meth:`release`."""
        if request.lease_id in self._granted or self.state_of(request.lease_id) is not None:
            raise InvalidArgument(f"lease {request.lease_id.hex()} is already known")
        if not self.feasible(request):
            self._waiting.append(_Entry(request, Placement.INFEASIBLE))
            self.changes.notify()
            return Placement.INFEASIBLE
        no_older_ready = not any(e.state is Placement.QUEUED for e in self._waiting)
        if no_older_ready and _fits(request.shape, self.available):
            self._take(request)
            self.changes.notify()
            return Placement.GRANTED
        self._waiting.append(_Entry(request, Placement.QUEUED))
        self.changes.notify()
        return Placement.QUEUED

    def try_grant_now(self, request: LeaseRequest) -> bool:
        """Grant-or-reject: take the resources if they are free now, never queue."""
        if self.state_of(request.lease_id) is not None:
            raise InvalidArgument(f"lease {request.lease_id.hex()} is already known")
        if self.feasible(request) and _fits(request.shape, self.available):
            self._take(request)
            self.changes.notify()
            return True
        self.changes.notify()
        return False

    def release(self, lease_id: bytes) -> list[bytes]:
        """Free a granted lease; returns the lease ids granted as a result (FIFO)."""
        if lease_id not in self._granted:
            raise NotFound(f"lease {lease_id.hex()} is not granted on this node")
        self._free(lease_id)
        self.changes.notify()
        return self._grant_waiting()

    def cancel(self, lease_id: bytes) -> bool:
        """Drop a waiting (queued or infeasible) request; False if it is not waiting."""
        for entry in self._waiting:
            if entry.request.lease_id == lease_id:
                self._waiting.remove(entry)
                self.changes.notify()
                return True
        self.changes.notify()
        return False

    def resize(self, new_totals: Mapping[str, float]) -> list[bytes]:
        """Set totals of existing, non-unit resources, keeping in-use amounts.

        Validates the whole request before changing anything.  As Ray's raylet, a shrink
        is clamped to what is free (``delta >= -available``): the total never drops below
        what is in use.  Returns lease ids granted because of the change.
        """
        for name, amount in new_totals.items():
            if name in UNIT_INSTANCE_RESOURCES:
                raise InvalidArgument(f"resizing unit-instance resource {name} is not supported")
            if name not in self.total:
                raise InvalidArgument(f"resource {name} does not exist on this node")
            if amount < 0:
                raise InvalidArgument(f"resource {name} cannot be resized to {amount}")
        for name, amount in new_totals.items():
            free = max(0.0, self.available.get(name, 0.0))
            delta = max(float(amount) - self.total[name], -free)
            self.total[name] += delta
            self.available[name] = self.available.get(name, 0.0) + delta
        self.changes.notify()
        return self._recheck()

    # -- placement-group bundles -----------------------------------------------------------

    def prepare_bundles(self, bundles: Iterable[tuple[BundleKey, Mapping[str, float]]]) -> bool:
        """Hold every new bundle's unit resources, or none (False) if they do not all fit
        now.  Bundles held already count as prepared (an idempotent retry)."""
        new: dict[BundleKey, dict[str, float]] = {}
        for key, unit in bundles:
            if key not in self._bundles:
                new[key] = {k: float(v) for k, v in unit.items() if v > 0}
        pool = dict(self.available)
        for unit in new.values():
            if not _fits(unit, pool):
                self.changes.notify()
                return False
            for name, amount in unit.items():
                pool[name] = pool.get(name, 0.0) - amount
        self.available = pool
        for key, unit in new.items():
            self._bundles[key] = _Bundle(unit)
        self.changes.notify()
        return True

    def commit_bundles(self, keys: Iterable[BundleKey]) -> list[bytes]:
        """Expose prepared bundles' resources; returns lease ids granted as a result.

        As Ray's raylet: a duplicate commit and a commit of an unknown bundle (never
        prepared here, or returned meanwhile) are skipped."""
        for key in keys:
            bundle = self._bundles.get(key)
            if bundle is None or bundle.committed:
                continue
            bundle.committed = True
            indexed, wildcard = bundle_resources(key[0], key[1], bundle.unit)
            for name, amount in (*indexed.items(), *wildcard.items()):
                self.total[name] = self.total.get(name, 0.0) + amount
                self.available[name] = self.available.get(name, 0.0) + amount
        self.changes.notify()
        return self._recheck()

    def return_bundle(self, key: BundleKey) -> tuple[list[bytes], list[bytes]]:
        """Give a bundle back: (leases evicted because they held its resources, leases
        granted with what was freed).  Unknown bundles are ignored."""
        bundle = self._bundles.pop(key, None)
        if bundle is None:
            self.changes.notify()
            return [], []
        evicted: list[bytes] = []
        if bundle.committed:
            indexed, wildcard = bundle_resources(key[0], key[1], bundle.unit)
            for lease_id, request in list(self._granted.items()):
                if any(name in indexed for name in request.shape):
                    evicted.append(lease_id)
                    self._free(lease_id)
            for lease_id, request in list(self._granted.items()):
                short = any(
                    name in wildcard and self.available.get(name, 0.0) + EPSILON < wildcard[name]
                    for name in request.shape
                )
                if short:
                    evicted.append(lease_id)
                    self._free(lease_id)
            for name, amount in (*indexed.items(), *wildcard.items()):
                left = self.total.get(name, 0.0) - amount
                if left > EPSILON:
                    self.total[name] = left
                    self.available[name] = self.available.get(name, 0.0) - amount
                else:
                    self.total.pop(name, None)
                    self.available.pop(name, None)
        for name, amount in bundle.unit.items():
            self.available[name] = self.available.get(name, 0.0) + amount
        self.changes.notify()
        return evicted, self._recheck()

    def release_unused_bundles(self, in_use: set[BundleKey]) -> tuple[list[bytes], list[bytes]]:
        """Return every bundle not in ``in_use`` (after a GCS restart)."""
        evicted: list[bytes] = []
        granted: list[bytes] = []
        for key in [k for k in self._bundles if k not in in_use]:
            gone, more = self.return_bundle(key)
            evicted += gone
            granted += more
        return evicted, [g for g in granted if g in self._granted]

    # -- internals -----------------------------------------------------------------------

    def _free(self, lease_id: bytes) -> None:
        request = self._granted.pop(lease_id)
        for name, amount in request.shape.items():
            self.available[name] = self.available.get(name, 0.0) + amount

    def _recheck(self) -> list[bytes]:
        """Totals changed: re-classify waiting requests and grant what fits now."""
        for entry in self._waiting:
            entry.state = Placement.QUEUED if self.feasible(entry.request) else Placement.INFEASIBLE
        return self._grant_waiting()

    def _take(self, request: LeaseRequest) -> None:
        for name, amount in request.shape.items():
            self.available[name] = self.available.get(name, 0.0) - amount
        self._granted[request.lease_id] = request

    def _grant_waiting(self) -> list[bytes]:
        """Grant ready requests strictly in arrival order; stop at the first that waits."""
        granted: list[bytes] = []
        while True:
            head = next((e for e in self._waiting if e.state is Placement.QUEUED), None)
            if head is None or not _fits(head.request.shape, self.available):
                return granted
            self._waiting.remove(head)
            self._take(head.request)
            granted.append(head.request.lease_id)
