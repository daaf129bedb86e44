"""Placement group records and their pending load (the gangs the autoscaler must place).

This is the part of Ray's ``GcsPlacementGroupManager`` the autoscaler needs: PGs are created
PENDING, persisted, listed, removed; pending / rescheduling ones become
``GangResourceRequest``s in ``GetClusterResourceState`` (gcs-server.md §2.1).  Bundle
placement on raylets (the 2PC prepare/commit) is future work.

Virtual clusters: our ``PlacementGroupTableData`` has no ``virtual_cluster_id`` (ant-ray's
field 17 collides with Ray 2.60's ``topology_assignments``, and its ``PlacementGroupSpec``
field 12 with ``topology_strategy``), so a PG's virtual cluster id is resolved at creation by
``job_cluster`` (the creator job's cluster, given at construction) and kept in a sidecar
persisted in the same batch under ``GCS_META`` ``pg_vc:<pg id>``.

Create and remove run on the manager's :class:`~gcs.managers.lane.ApplyLane`; removals are
told to :class:`~gcs.managers.events.PlacementGroupEvents` listeners after they are persisted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gcs.clock import Clock, now_ms
from gcs.errors import InvalidArgument, NotFound
from gcs.labels import selector_proto as parse_selector
from gcs.managers.events import PlacementGroupEvents
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.proto import autoscaler_pb2, common_pb2, gcs_pb2
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_META, TABLE_PLACEMENT_GROUP

PG = gcs_pb2.PlacementGroupTableData
PENDING_STATES = (PG.PENDING, PG.RESCHEDULING)
MAX_LOAD_REPORT = 1000  # Ray: max_placement_group_load_report_size
VC_SIDECAR_PREFIX = b"pg_vc:"
JobCluster = Callable[[bytes], str]
"""creator job id -> its virtual cluster id ("" = none / the primary)."""


def _no_cluster(job_id: bytes) -> str:
    return ""


class PlacementGroupManager:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        events: PlacementGroupEvents | None = None,
        job_cluster: JobCluster = _no_cluster,
        lane_policy: ResolvePolicy | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._events = events if events is not None else PlacementGroupEvents()
        self._job_cluster = job_cluster
        self._lane = ApplyLane(store, "placement_groups", policy=lane_policy)
        self.groups: dict[bytes, gcs_pb2.PlacementGroupTableData] = {}
        self.virtual_cluster_of: dict[bytes, str] = {}
        """PG id -> virtual cluster id (only PGs created inside one)."""
        self.version = 0
        """Bumped on every create/remove (caches of pending gangs key on it)."""

    async def load(self) -> None:
        for raw in (await self._store.get_all(TABLE_PLACEMENT_GROUP)).values():
            pg = PG.FromString(raw)
            self.groups[pg.placement_group_id] = pg
        sidecar = await self._store.scan_prefix(TABLE_META, VC_SIDECAR_PREFIX)
        for key, value in sidecar.items():
            pg_id = key[len(VC_SIDECAR_PREFIX) :]
            if pg_id in self.groups:
                self.virtual_cluster_of[pg_id] = value.decode()

    async def create(self, spec: common_pb2.PlacementGroupSpec) -> None:
        pg_id = spec.placement_group_id
        if len(pg_id) != 18:
            raise InvalidArgument(
                f"placement_group_spec.placement_group_id must be 18 bytes, got {len(pg_id)}"
            )
        if not spec.bundles:
            raise InvalidArgument("placement_group_spec.bundles must not be empty")
        for i, bundle in enumerate(spec.bundles):
            if not bundle.unit_resources:
                raise InvalidArgument(f"placement_group_spec.bundles[{i}].unit_resources is empty")
            for name, amount in bundle.unit_resources.items():
                if not amount >= 0:
                    raise InvalidArgument(
                        f"placement_group_spec.bundles[{i}].unit_resources[{name}] must be >= 0"
                    )
        if spec.strategy not in common_pb2.PlacementStrategy.values():
            raise InvalidArgument(f"placement_group_spec.strategy: unknown value {spec.strategy}")
        async with self._lane:
            if pg_id in self.groups:
                return  # idempotent retry
            pg = PG(
                placement_group_id=pg_id,
                name=spec.name,
                bundles=spec.bundles,
                strategy=spec.strategy,
                state=PG.PENDING,
                creator_job_id=spec.creator_job_id,
                creator_actor_id=spec.creator_actor_id,
                is_detached=spec.is_detached,
                soft_target_node_id=spec.soft_target_node_id,
                placement_group_creation_timestamp_ms=now_ms(self._clock),
            )
            for i, bundle in enumerate(pg.bundles):
                bundle.bundle_id.placement_group_id = pg_id
                bundle.bundle_id.bundle_index = i
            vc_id = self._job_cluster(spec.creator_job_id)
            batch = WriteBatch().put(TABLE_PLACEMENT_GROUP, pg_id, pg.SerializeToString())
            if vc_id:
                batch.put(TABLE_META, VC_SIDECAR_PREFIX + pg_id, vc_id.encode())

            def apply() -> None:
                self.groups[pg_id] = pg
                if vc_id:
                    self.virtual_cluster_of[pg_id] = vc_id
                self.version += 1

            await self._lane.commit(batch, apply)

    async def remove(self, pg_id: bytes) -> None:
        async with self._lane:
            pg = self.groups.get(pg_id)
            if pg is None:
                raise NotFound(f"placement group {pg_id.hex()} does not exist")
            if pg.state == PG.REMOVED:
                return
            updated = PG()
            updated.CopyFrom(pg)
            updated.state = PG.REMOVED

            def apply() -> None:
                self.groups[pg_id] = updated
                self.version += 1
                self._events.removed(updated, self.virtual_cluster_of.get(pg_id, ""))

            batch = WriteBatch().put(TABLE_PLACEMENT_GROUP, pg_id, updated.SerializeToString())
            await self._lane.commit(batch, apply)

    def get(self, pg_id: bytes) -> gcs_pb2.PlacementGroupTableData | None:
        return self.groups.get(pg_id)

    def pending(self) -> Iterator[gcs_pb2.PlacementGroupTableData]:
        count = 0
        for pg in self.groups.values():
            if pg.state in PENDING_STATES:
                yield pg
                count += 1
                if count >= MAX_LOAD_REPORT:
                    return

    def bundles_on_node(self, node_id: bytes) -> list[bytes]:
        return [
            pg.placement_group_id
            for pg in self.groups.values()
            if pg.state != PG.REMOVED and any(b.node_id == node_id for b in pg.bundles)
        ]

    def gang_requests(self) -> list[autoscaler_pb2.GangResourceRequest]:
        return [gang_request(pg) for pg in self.pending()]


def gang_request(pg: gcs_pb2.PlacementGroupTableData) -> autoscaler_pb2.GangResourceRequest:
    """One ``GangResourceRequest`` per pending PG, shaped as Ray 2.60 shapes it."""
    pg_hex = pg.placement_group_id.hex()
    strategy = common_pb2.PlacementStrategy.Name(pg.strategy)
    state = PG.PlacementGroupState.Name(pg.state)
    out = autoscaler_pb2.GangResourceRequest(details=f"{pg_hex}:{strategy}|{state}")
    constraint = None
    if pg.strategy == common_pb2.STRICT_SPREAD:
        constraint = autoscaler_pb2.PlacementConstraint(
            anti_affinity=autoscaler_pb2.AntiAffinityConstraint(label_name=f"_PG_{pg_hex}")
        )
    elif pg.strategy == common_pb2.STRICT_PACK:
        constraint = autoscaler_pb2.PlacementConstraint(
            affinity=autoscaler_pb2.AffinityConstraint(label_name=f"_PG_{pg_hex}")
        )
    selector = out.bundle_selectors.add()
    for bundle in pg.bundles:
        if bundle.node_id and bundle.node_id != b"\xff" * 28:
            continue  # placed already (only in RESCHEDULING groups)
        legacy = out.requests.add(resources_bundle=bundle.unit_resources)
        if constraint is not None:
            legacy.placement_constraints.append(constraint)
        request = selector.resource_requests.add()
        request.CopyFrom(legacy)
        if bundle.label_selector:
            request.label_selectors.append(parse_selector(bundle.label_selector))
    return out
