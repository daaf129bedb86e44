"""A fake :class:`~gcs.rpc.raylet_io.actors.ActorGateway` that records calls.

By default every lease is granted at once with a fresh worker on the asked node and every
PushTask succeeds.  Tests script the next answers per node (``lease_script[node_id]``: a
reply or an exception, consumed in order) and for pushes (``push_script``), or hold pushes
until an event is set (``push_gate``) to observe the actor mid-creation.  Every recorded
call notifies :attr:`FakeActorGateway.changes` (tests wait for calls, not for time).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from dataclasses import dataclass, field

from gcs.base.changes import Changes
from gcs.proto import common_pb2, core_worker_pb2, node_manager_pb2

__all__ = ["FakeActorGateway", "LeaseCall"]

LeaseReply = node_manager_pb2.RequestWorkerLeaseReply


@dataclass(frozen=True, slots=True)
class LeaseCall:
    node_id: bytes
    address: str
    request: node_manager_pb2.RequestWorkerLeaseRequest


@dataclass(slots=True)
class FakeActorGateway:
    leases: list[LeaseCall] = field(default_factory=list)
    pushes: list[tuple[common_pb2.Address, core_worker_pb2.PushTaskRequest]] = field(
        default_factory=list
    )
    kills: list[tuple[bytes, node_manager_pb2.KillLocalActorRequest]] = field(default_factory=list)
    forgotten: list[bytes] = field(default_factory=list)
    released: list[tuple[bytes, list[bytes]]] = field(default_factory=list)
    cancelled: list[tuple[bytes, bytes]] = field(default_factory=list)
    """(node id, lease id) of CancelWorkerLease calls."""
    lease_gate: dict[bytes, asyncio.Event] = field(default_factory=dict)
    """Leases at these nodes wait for the event (a raylet queueing the lease)."""
    lease_script: dict[bytes, deque[LeaseReply | Exception]] = field(
        default_factory=lambda: defaultdict(deque)
    )
    push_script: deque[core_worker_pb2.PushTaskReply | Exception] = field(default_factory=deque)
    push_gate: asyncio.Event | None = None
    changes: Changes = field(default_factory=Changes)
    _workers: int = 0

    def worker_on(self, node_id: bytes) -> common_pb2.Address:
        """A fresh worker address on ``node_id`` (worker ids are distinct and readable)."""
        self._workers += 1
        worker_id = node_id[:1] + self._workers.to_bytes(4, "big") + b"\0" * 23
        return common_pb2.Address(
            node_id=node_id, ip_address="127.0.0.9", port=20000 + self._workers, worker_id=worker_id
        )

    async def request_worker_lease(
        self,
        node_id: bytes,
        address: str,
        request: node_manager_pb2.RequestWorkerLeaseRequest,
        timeout_s: float | None,
    ) -> LeaseReply:
        self.leases.append(LeaseCall(node_id, address, request))
        self.changes.notify()
        gate = self.lease_gate.get(node_id)
        if gate is not None:
            await gate.wait()
        await asyncio.sleep(0)
        script = self.lease_script.get(node_id)
        if script:
            answer = script.popleft()
            if isinstance(answer, Exception):
                raise answer
            return answer
        worker = self.worker_on(node_id)
        return LeaseReply(worker_address=worker, worker_pid=4000 + self._workers)

    async def push_task(
        self, worker: common_pb2.Address, request: core_worker_pb2.PushTaskRequest
    ) -> core_worker_pb2.PushTaskReply:
        self.pushes.append((worker, request))
        self.changes.notify()
        if self.push_gate is not None:
            await self.push_gate.wait()
        await asyncio.sleep(0)
        if self.push_script:
            answer = self.push_script.popleft()
            if isinstance(answer, Exception):
                raise answer
            return answer
        return core_worker_pb2.PushTaskReply()

    async def kill_local_actor(
        self,
        node_id: bytes,
        address: str,
        request: node_manager_pb2.KillLocalActorRequest,
        timeout_s: float,
    ) -> None:
        self.kills.append((node_id, request))
        self.changes.notify()

    async def cancel_worker_lease(
        self, node_id: bytes, address: str, lease_id: bytes, timeout_s: float
    ) -> None:
        self.cancelled.append((node_id, lease_id))
        self.changes.notify()

    async def release_unused_actor_workers(
        self, node_id: bytes, address: str, in_use: list[bytes], timeout_s: float
    ) -> None:
        self.released.append((node_id, sorted(in_use)))
        self.changes.notify()

    def forget_worker(self, worker: common_pb2.Address) -> None:
        self.forgotten.append(worker.worker_id)

    async def close(self) -> None:
        return None
