"""Bundles reserved on raylets in Ray's two phases, through the :class:`RayletGateway`.

``reserve``: ``PrepareBundleResources`` on every node of the group's chosen set at once; all
say yes -> ``CommitBundleResources`` on each.  Any refusal, error or lost answer gives back
what was taken (``RemovePlacementGroupBundles``, Ray 2.60's name for CancelResourceReserve:
one call per node, bundles of one group) and reports why, so the caller retries later.
Calls go to alive nodes only; every failure is a domain error from the gateway, logged here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

import structlog

from gcs.base.errors import GcsError
from gcs.managers.nodes import NodeManager
from gcs.proto import common_pb2
from gcs.rpc.raylet_io.gateway import RayletGateway, raylet_address

log = structlog.get_logger("gcs.placement_groups")

RELEASE_WORKERS = 32
"""Concurrent ``ReleaseUnusedBundles`` calls of a restart's fan-out (see release_unused).
The gateway's rate bounds the fan-out anyway (``raylet_io.max_calls_per_s``, 5,000/s), which
32 callers reach with raylets answering within 6 ms; more (it was 256) only put more
connects into each loop turn right after the port binds, ahead of the GCS's first answers."""

ByNode = Mapping[bytes, Sequence[common_pb2.Bundle]]
"""Node id -> the bundles (of one group) it takes."""


def group_by_node(bundles: Sequence[common_pb2.Bundle]) -> dict[bytes, list[common_pb2.Bundle]]:
    out: dict[bytes, list[common_pb2.Bundle]] = {}
    for bundle in bundles:
        out.setdefault(bundle.node_id, []).append(bundle)
    return out


class BundleReservations:
    def __init__(self, raylets: RayletGateway, nodes: NodeManager, timeout_s: float) -> None:
        self._raylets = raylets
        self._nodes = nodes
        self._timeout_s = timeout_s

    async def reserve(self, pg_id: bytes, by_node: ByNode) -> str:
        """Prepare everywhere, then commit everywhere: "" on success, else why not (and
        nothing stays reserved that this call could give back)."""
        addresses = self._addresses(by_node)
        if len(addresses) < len(by_node):
            return "a chosen node is not alive"
        prepared = await self._each(
            addresses,
            lambda n: self._raylets.prepare_bundles(n, addresses[n], by_node[n], self._timeout_s),
        )
        holding = [n for n, ok in prepared.items() if ok is True]
        if len(holding) < len(by_node):
            await self.give_back(pg_id, {n: by_node[n] for n in holding})
            failed = ", ".join(n.hex()[:12] for n, ok in prepared.items() if ok is not True)
            return f"prepare failed on {failed}"

        async def commit(node_id: bytes) -> bool:
            await self._raylets.commit_bundles(
                node_id, addresses[node_id], by_node[node_id], self._timeout_s
            )
            return True

        committed = await self._each(addresses, commit)
        if not all(ok is True for ok in committed.values()):
            await self.give_back(pg_id, by_node)
            return "commit failed"
        return ""

    async def give_back(self, pg_id: bytes, by_node: ByNode) -> None:
        """``RemovePlacementGroupBundles`` on each alive node (a dead node's bundles went
        with it); a failure is logged: the raylet releases it after a GCS restart."""
        addresses = self._addresses(by_node)
        await asyncio.gather(
            *(self._give_back_on(pg_id, n, a, by_node[n]) for n, a in addresses.items())
        )

    async def release_unused(self, in_use: Mapping[bytes, Sequence[common_pb2.Bundle]]) -> None:
        """``ReleaseUnusedBundles`` to every alive raylet with the bundles in use there.

        A fixed number of workers take the nodes in turn (the gateway bounds in-flight
        calls and their rate anyway): one task per node would put 10,000 tasks on the loop
        in the tick after the port binds, and a new leader's first calls would wait behind
        their creation."""
        alive = list(self._nodes.alive.items())  # addresses as they are reached, not at once
        queue = iter(alive)

        async def worker() -> None:
            for node_id, node in queue:
                await self._release_on(node_id, raylet_address(node), in_use.get(node_id, ()))

        await asyncio.gather(*(worker() for _ in range(min(RELEASE_WORKERS, len(alive)))))

    # -- internals ---------------------------------------------------------------------------

    def _addresses(self, by_node: ByNode) -> dict[bytes, str]:
        out = {}
        for node_id in by_node:
            node = self._nodes.alive.get(node_id)
            if node is not None:
                out[node_id] = raylet_address(node)
        return out

    async def _each(
        self, addresses: Mapping[bytes, str], call: Callable[[bytes], Awaitable[bool]]
    ) -> dict[bytes, bool | BaseException]:
        nodes = list(addresses)
        results = await asyncio.gather(*(call(n) for n in nodes), return_exceptions=True)
        for node_id, result in zip(nodes, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, GcsError):
                    raise result
                log.info("pg.raylet_call_failed", node_id=node_id.hex(), error=result.message)
        return dict(zip(nodes, results, strict=True))

    async def _give_back_on(
        self, pg_id: bytes, node_id: bytes, address: str, bundles: Sequence[common_pb2.Bundle]
    ) -> None:
        try:
            await self._raylets.remove_bundles(node_id, address, pg_id, bundles, self._timeout_s)
        except GcsError as err:
            log.warning("pg.return_failed", node_id=node_id.hex(), error=err.message)

    async def _release_on(
        self, node_id: bytes, address: str, bundles: Sequence[common_pb2.Bundle]
    ) -> None:
        try:
            await self._raylets.release_unused_bundles(node_id, address, bundles, self._timeout_s)
        except GcsError as err:
            log.warning("pg.release_unused_failed", node_id=node_id.hex(), error=err.message)
