"""A fake :class:`~gcs.rpc.raylet_io.gateway.RayletGateway` for manager and server tests.

It records every call, answers from per-node settings, raises the gateway's domain errors on
demand, and can hold calls open (``hold()`` / ``release()``) so tests see how many are in
flight at once.  No sockets, no clocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gcs.base.errors import RayletUnreachable, RayStatusCode, RayStatusError
from gcs.proto import common_pb2, gcs_pb2, node_manager_pb2

__all__ = ["FakeRayletGateway", "RayletCall"]


@dataclass(frozen=True, slots=True)
class RayletCall:
    method: str
    node_id: bytes
    address: str


@dataclass
class FakeRayletGateway:
    loads: dict[bytes, gcs_pb2.ResourcesData] = field(default_factory=dict)
    """GetResourceLoad answers per node (default: an empty ResourcesData)."""
    unreachable: set[bytes] = field(default_factory=set)
    """Nodes whose every call raises RayletUnreachable."""
    not_serving: set[bytes] = field(default_factory=set)
    """Nodes whose health check answers NOT_SERVING."""
    drain_accept: bool = True
    resize_refusal: str = ""
    """When set, Resize raises RayStatusError(InvalidArgument) with this message."""
    refuse_prepare: set[bytes] = field(default_factory=set)
    """Nodes whose PrepareBundleResources answers success=false."""
    lose_commit: set[bytes] = field(default_factory=set)
    """Nodes whose CommitBundleResources gets no answer (RayletUnreachable) after the
    raylet committed."""
    bundles: dict[bytes, dict[tuple[bytes, int], bool]] = field(default_factory=dict)
    """Per node: bundles held (prepared or committed) -> committed, as a raylet keeps them."""
    released_in_use: dict[bytes, list[tuple[bytes, int]]] = field(default_factory=dict)
    """The last ReleaseUnusedBundles ``bundles_in_use`` per node."""
    calls: list[RayletCall] = field(default_factory=list)
    forgotten: list[bytes] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    closed: bool = False
    _gate: asyncio.Event | None = None

    # ------------------------------------------------------------------ test controls

    def hold(self) -> None:
        """From now on calls wait (after being recorded) until :meth:`release`."""
        self._gate = asyncio.Event()

    def release(self) -> None:
        if self._gate is not None:
            self._gate.set()
            self._gate = None

    def calls_to(self, method: str) -> list[RayletCall]:
        return [c for c in self.calls if c.method == method]

    # ------------------------------------------------------------------ RayletGateway

    async def _enter(self, method: str, node_id: bytes, address: str) -> None:
        self.calls.append(RayletCall(method, node_id, address))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            gate = self._gate
            if gate is not None:
                await gate.wait()
            if node_id in self.unreachable:
                raise RayletUnreachable(node_id, f"raylet {node_id.hex()} {method}: refused")
        finally:
            self.in_flight -= 1

    async def get_resource_load(
        self, node_id: bytes, address: str, timeout_s: float
    ) -> gcs_pb2.ResourcesData:
        await self._enter("GetResourceLoad", node_id, address)
        out = gcs_pb2.ResourcesData()
        if node_id in self.loads:
            out.CopyFrom(self.loads[node_id])
        return out

    async def health_check(self, node_id: bytes, address: str, timeout_s: float) -> bool:
        await self._enter("HealthCheck", node_id, address)
        return node_id not in self.not_serving

    async def drain(
        self,
        node_id: bytes,
        address: str,
        request: node_manager_pb2.DrainRayletRequest,
        timeout_s: float,
    ) -> node_manager_pb2.DrainRayletReply:
        await self._enter("DrainRaylet", node_id, address)
        if self.drain_accept:
            return node_manager_pb2.DrainRayletReply(is_accepted=True)
        return node_manager_pb2.DrainRayletReply(is_accepted=False, rejection_reason_message="busy")

    async def resize(
        self, node_id: bytes, address: str, resources: Mapping[str, float], timeout_s: float
    ) -> dict[str, float]:
        await self._enter("ResizeLocalResourceInstances", node_id, address)
        if self.resize_refusal:
            raise RayStatusError(RayStatusCode.InvalidArgument, self.resize_refusal)
        return dict(resources)

    async def notify_gcs_restart(self, node_id: bytes, address: str, timeout_s: float) -> None:
        await self._enter("NotifyGCSRestart", node_id, address)

    async def prepare_bundles(
        self, node_id: bytes, address: str, bundles: Sequence[common_pb2.Bundle], timeout_s: float
    ) -> bool:
        await self._enter("PrepareBundleResources", node_id, address)
        if node_id in self.refuse_prepare:
            return False
        held = self.bundles.setdefault(node_id, {})
        for b in bundles:
            held.setdefault(_key(b), False)
        return True

    async def commit_bundles(
        self, node_id: bytes, address: str, bundles: Sequence[common_pb2.Bundle], timeout_s: float
    ) -> None:
        await self._enter("CommitBundleResources", node_id, address)
        held = self.bundles.setdefault(node_id, {})
        for b in bundles:  # unknown bundles are skipped, as a raylet does
            if _key(b) in held:
                held[_key(b)] = True
        if node_id in self.lose_commit:
            raise RayletUnreachable(node_id, f"raylet {node_id.hex()} commit: deadline exceeded")

    async def remove_bundles(
        self,
        node_id: bytes,
        address: str,
        pg_id: bytes,
        bundles: Sequence[common_pb2.Bundle],
        timeout_s: float,
    ) -> None:
        await self._enter("RemovePlacementGroupBundles", node_id, address)
        held = self.bundles.setdefault(node_id, {})
        for b in bundles:
            held.pop(_key(b), None)

    async def release_unused_bundles(
        self,
        node_id: bytes,
        address: str,
        in_use: Sequence[common_pb2.Bundle],
        timeout_s: float,
    ) -> None:
        await self._enter("ReleaseUnusedBundles", node_id, address)
        keep = [_key(b) for b in in_use]
        self.released_in_use[node_id] = keep
        held = self.bundles.setdefault(node_id, {})
        for key in [k for k in held if k not in keep]:
            del held[key]

    def forget(self, node_id: bytes) -> None:
        self.forgotten.append(node_id)

    async def close(self) -> None:
        self.closed = True
        self.release()


def _key(bundle: common_pb2.Bundle) -> tuple[bytes, int]:
    return bundle.bundle_id.placement_group_id, bundle.bundle_id.bundle_index
