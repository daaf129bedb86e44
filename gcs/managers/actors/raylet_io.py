"""The actor manager's calls to raylets: kill a worker, cancel a lease, free unused workers.

All best effort, as in Ray: a raylet that is gone or refuses is logged, never raised (a dead
node kills its workers itself).  Nothing here touches actor state.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from gcs.base.errors import GcsError
from gcs.managers.actors.scheduler import Attempt
from gcs.proto import common_pb2, gcs_pb2, node_manager_pb2
from gcs.rpc.raylet_io.actors import ActorGateway
from gcs.rpc.raylet_io.gateway import raylet_address

__all__ = ["ActorRayletIo"]

log = structlog.get_logger("gcs.actors")


class ActorRayletIo:
    def __init__(
        self,
        gateway: ActorGateway,
        alive_nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo],
        timeout_s: float,
    ) -> None:
        self._gateway = gateway
        self._alive_nodes = alive_nodes
        self._timeout_s = timeout_s

    async def kill(
        self,
        node_id: bytes,
        actor_id: bytes,
        worker: common_pb2.Address,
        cause: common_pb2.ActorDeathCause | None,
        force: bool,
    ) -> None:
        """``KillLocalActor`` on the worker's raylet (best effort: a dead node kills it)."""
        node = self._alive_nodes.get(node_id or worker.node_id)
        self._gateway.forget_worker(worker)
        if node is None:
            return
        request = node_manager_pb2.KillLocalActorRequest(
            intended_actor_id=actor_id, worker_id=worker.worker_id, force_kill=force
        )
        if cause is not None:
            request.death_cause.CopyFrom(cause)
        try:
            await self._gateway.kill_local_actor(
                node.node_id, raylet_address(node), request, self._timeout_s
            )
        except GcsError as err:
            log.info("actor.kill_failed", actor_id=actor_id.hex(), error=err.message)

    async def cancel_lease(self, attempt: Attempt) -> None:
        try:
            await self._gateway.cancel_worker_lease(
                attempt.node_id, attempt.raylet_address, attempt.lease_id, self._timeout_s
            )
        except GcsError as err:
            log.info(
                "actor.cancel_lease_failed", actor_id=attempt.actor_id.hex(), error=err.message
            )

    async def release_unused_workers(self, node: gcs_pb2.GcsNodeInfo, in_use: list[bytes]) -> None:
        try:
            await self._gateway.release_unused_actor_workers(
                node.node_id, raylet_address(node), in_use, self._timeout_s
            )
        except GcsError as err:
            log.info("actor.release_unused_failed", node_id=node.node_id.hex(), error=err.message)
