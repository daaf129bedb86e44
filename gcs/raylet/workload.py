"""Synthetic work: place N tasks, each holding a resource shape for S seconds, on raylets.

Placement mirrors what a Ray driver sees: tasks go to alive nodes whose totals fit the shape
(and whose labels match the selector), spread evenly (least tasks placed so far, then node
id).  A task that fits no node is still sent, to one node, where it waits as *infeasible* so
the demand shows up in ``resource_load_by_shape`` and the autoscaler can react.

Attached mode (default): this process holds each lease, sleeps S seconds after the grant and
returns it.  A lease still queued after ``respill_s`` moves to a node that has room now (from
the GCS's view of available resources; Ray's raylets spill back the same way), so nodes an
autoscaler adds take queued work: the request is withdrawn (CancelWorkerLease) and sent to
the other node unless a grant crossed the withdrawal.

Detached mode: requests carry metadata ``gcs-synthetic-seconds`` and
``gcs-synthetic-detach: 1``; each raylet replies at once and frees the lease itself S seconds
after granting it, so demand outlives the submitting process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2, node_manager_pb2
from gcs.raylet import convert
from gcs.raylet.agent import CLUSTER_ID_METADATA_KEY
from gcs.raylet.resources import LabelConstraint, selector_matches
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import NODE_INFO, NODE_MANAGER, NODE_RESOURCE_INFO
from gcs.rpc.security import Security


@dataclass(frozen=True)
class TaskSpec:
    resources: Mapping[str, float]
    seconds: float
    label_selector: tuple[LabelConstraint, ...] = ()
    #: The job the tasks belong to (b"" = none): a job running in a virtual cluster books
    #: their demand to it.
    job_id: bytes = b""


@dataclass(frozen=True)
class NodeTarget:
    node_id: bytes
    address: str
    """``host:port`` of the raylet's NodeManagerService."""
    total: Mapping[str, float]
    labels: Mapping[str, str]


@dataclass
class SubmitResult:
    placed: Counter[str] = field(default_factory=Counter)
    """Tasks sent per raylet address."""
    granted: int = 0
    queued: int = 0
    """Detached only: accepted by a raylet but still waiting (ready or infeasible)."""
    infeasible: int = 0
    """Tasks that fit no alive node (sent anyway, to wait as infeasible)."""
    rejected: int = 0
    canceled: int = 0
    returned: int = 0
    timed_out: int = 0
    """Tasks still waiting (or running, attached) when ``timeout_s`` struck."""
    ran_on: Counter[str] = field(default_factory=Counter)
    """Attached: grants per raylet address (after any move)."""
    moved: int = 0
    """Attached: queued leases moved to a node with room."""
    unreachable: int = 0
    """Tasks whose raylet could not be reached (gone since the node list was read)."""
    last_error: str = ""
    """The last such raylet error, for the one line that reports them."""
    abandoned: int = 0
    """Tasks still waiting when the caller's ``stop`` event ended the wait (e.g. the
    autoscaler declared their shape infeasible)."""


def plan(task: TaskSpec, count: int, nodes: Sequence[NodeTarget]) -> list[tuple[NodeTarget, bool]]:
    """Pure placement: (node, feasible) per task; infeasible tasks go to the first node."""
    if not nodes:
        raise ValueError("no alive nodes to place tasks on")
    ordered = sorted(nodes, key=lambda n: n.node_id)
    fitting = [
        n
        for n in ordered
        if selector_matches(task.label_selector, n.labels)
        and all(n.total.get(k, 0.0) >= v for k, v in task.resources.items())
    ]
    if not fitting:
        return [(ordered[0], False)] * count
    return [(fitting[i % len(fitting)], True) for i in range(count)]


async def alive_nodes(
    gcs_address: str, *, timeout_s: float = 10.0, security: Security | None = None
) -> list[NodeTarget]:
    security = security if security is not None else Security.from_env()
    async with security.aio_channel(gcs_address) as channel:
        stub = ServiceStub(channel, NODE_INFO, timeout_s=timeout_s)
        cluster = await stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest())
        stub.set_metadata([(CLUSTER_ID_METADATA_KEY, cluster.cluster_id.hex())])
        reply = await stub.GetAllNodeInfo(
            gcs_service_pb2.GetAllNodeInfoRequest(state_filter=gcs_pb2.GcsNodeInfo.ALIVE)
        )
    return [
        NodeTarget(
            node_id=n.node_id,
            address=f"{n.node_manager_address}:{n.node_manager_port}",
            total=dict(n.resources_total),
            labels=dict(n.labels),
        )
        for n in reply.node_info_list
        if n.state == gcs_pb2.GcsNodeInfo.ALIVE
    ]


def _lease_request(task: TaskSpec) -> node_manager_pb2.RequestWorkerLeaseRequest:
    return node_manager_pb2.RequestWorkerLeaseRequest(
        lease_spec=common_pb2.LeaseSpec(
            lease_id=os.urandom(28),
            required_resources=dict(task.resources),
            label_selector=convert.selector_to_proto(task.label_selector),
            task_name="gcs-synthetic",
            job_id=task.job_id,
        )
    )


class RoomFinder:
    """Nodes with room for a task now, from the GCS (alive nodes + available resources),
    refreshed at most every ``refresh_s``; a suggestion is reserved until the next refresh so
    several queued tasks do not all move to the same free slot."""

    def __init__(self, gcs_address: str, security: Security, *, refresh_s: float = 1.0) -> None:
        self._address = gcs_address
        self._security = security
        self._refresh_s = refresh_s
        self._at = -1e9
        self._nodes: dict[str, NodeTarget] = {}
        self._free: dict[str, dict[str, float]] = {}
        self._lock = asyncio.Lock()

    async def _refresh(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - self._at < self._refresh_s:
            return
        self._at = loop.time()
        nodes = await alive_nodes(self._address, security=self._security)
        async with self._security.aio_channel(self._address) as channel:
            info = ServiceStub(channel, NODE_INFO, timeout_s=10)
            cluster = await info.GetClusterId(gcs_service_pb2.GetClusterIdRequest())
            md = [(CLUSTER_ID_METADATA_KEY, cluster.cluster_id.hex())]
            stub = ServiceStub(channel, NODE_RESOURCE_INFO, metadata=md, timeout_s=10)
            reply = await stub.GetAllAvailableResources(
                gcs_service_pb2.GetAllAvailableResourcesRequest()
            )
        by_id = {n.node_id: n for n in nodes}
        self._nodes = {n.address: n for n in nodes}
        self._free = {
            by_id[r.node_id].address: dict(r.resources_available)
            for r in reply.resources_list
            if r.node_id in by_id
        }

    async def node_with_room(self, task: TaskSpec, *, exclude: str) -> str | None:
        async with self._lock:
            try:
                await self._refresh()
            except (grpc.aio.AioRpcError, OSError):
                return None
            for address in sorted(self._free):
                node, free = self._nodes.get(address), self._free[address]
                if address == exclude or node is None:
                    continue
                if not selector_matches(task.label_selector, node.labels):
                    continue
                if all(free.get(k, 0.0) >= v for k, v in task.resources.items()):
                    for k, v in task.resources.items():
                        free[k] -= v  # reserved until the next refresh
                    return address
            return None


async def submit(
    gcs_address: str,
    task: TaskSpec,
    count: int,
    *,
    detach: bool = False,
    timeout_s: float | None = None,
    security: Security | None = None,
    respill_s: float = 1.0,
    on_placed: Callable[[SubmitResult], None] | None = None,
    stop: asyncio.Event | None = None,
) -> SubmitResult:
    """Place ``count`` tasks; attached mode returns once all finished (or ``timeout_s``, or
    ``stop`` is set: what still waits is withdrawn and counted as ``abandoned``).
    ``on_placed`` sees the result once every task is sent and before any wait (so a caller
    can say at once that some fit no alive node).  ``security`` (token, TLS) defaults to
    Ray's environment; ``respill_s`` <= 0 never moves a queued lease."""
    security = security if security is not None else Security.from_env()
    nodes = await alive_nodes(gcs_address, security=security)
    placements = plan(task, count, nodes)
    result = SubmitResult()
    channels: dict[str, grpc.aio.Channel] = {}
    stubs: dict[str, ServiceStub] = {}

    def stub_for(address: str) -> ServiceStub:
        if address not in stubs:
            channels[address] = security.aio_channel(address)
            stubs[address] = ServiceStub(channels[address], NODE_MANAGER, timeout_s=None)
        return stubs[address]

    finder = RoomFinder(gcs_address, security) if respill_s > 0 and not detach else None
    try:
        for node, feasible in placements:
            result.placed[node.address] += 1
            result.infeasible += not feasible
        runs = [
            _run_one(stub_for, node.address, task, detach, result, finder, respill_s)
            for node, _ in placements
        ]
        pending: list[asyncio.Future[None]] = [asyncio.ensure_future(r) for r in runs]
        if on_placed is not None:
            on_placed(result)
        try:
            done = await _wait_for(pending, timeout_s, stop)
        finally:  # cancelled, timed out or stopped: nothing left running or unawaited
            late = {fut for fut in pending if not fut.done()}
            for fut in late:
                fut.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if stop is not None and stop.is_set():
            result.abandoned = len(late)
        else:
            result.timed_out = len(late)
        for fut in done:
            # every outcome read: a raylet gone since the node list was read is counted, not
            # left as an unretrieved task exception (one traceback per task in the log)
            if isinstance(err := fut.exception(), grpc.aio.AioRpcError):
                result.unreachable += 1
                result.last_error = f"{err.code().name}: {err.details()}"
            elif err is not None:
                raise err
    finally:
        for channel in channels.values():
            await channel.close()
    return result


async def _wait_for(
    pending: Sequence[asyncio.Future[None]], timeout_s: float | None, stop: asyncio.Event | None
) -> set[asyncio.Future[None]]:
    """Until every task is done, ``timeout_s`` passed or ``stop`` is set; the done ones."""
    if stop is None:
        done, _ = await asyncio.wait(pending, timeout=timeout_s)
        return done
    stopper = asyncio.ensure_future(stop.wait())
    everything = asyncio.ensure_future(asyncio.wait(pending, timeout=timeout_s))
    try:
        await asyncio.wait({stopper, everything}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in (stopper, everything):
            waiter.cancel()
        await asyncio.gather(stopper, everything, return_exceptions=True)
    return {fut for fut in pending if fut.done()}


async def _run_one(
    stub_for: Callable[[str], ServiceStub],
    address: str,
    task: TaskSpec,
    detach: bool,
    result: SubmitResult,
    finder: RoomFinder | None,
    respill_s: float,
) -> None:
    stub = stub_for(address)
    request = _lease_request(task)
    lease_id = request.lease_spec.lease_id
    if detach:
        metadata = [
            (convert.SYNTHETIC_SECONDS_KEY, repr(float(task.seconds))),
            (convert.SYNTHETIC_DETACH_KEY, "1"),
        ]
        reply = await stub.RequestWorkerLease(request, metadata=metadata, timeout=30)
        _count_reply(reply, result, detached=True)
        return
    # attached too, the raylet is told the hold time: if this process vanishes (Ctrl-C, a
    # grant crossing a cancel on the wire) the raylet frees the lease itself
    hold = [(convert.SYNTHETIC_SECONDS_KEY, repr(float(task.seconds)))]
    try:
        while True:
            call = asyncio.ensure_future(stub.RequestWorkerLease(request, metadata=hold))
            answer, target = await _await_or_move(
                call, stub, lease_id, task, address, finder, respill_s
            )
            if answer is not None:
                reply = answer
                break
            assert target is not None
            address, stub = target, stub_for(target)  # withdrawn here: ask the node with room
            request = _lease_request(task)
            lease_id = request.lease_spec.lease_id
            result.moved += 1
    except asyncio.CancelledError:
        # timed out while waiting: withdraw the request so it stops counting as demand; if
        # the grant crossed the cancel on the wire, hand the lease back too (both idempotent)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.CancelWorkerLease(
                node_manager_pb2.CancelWorkerLeaseRequest(lease_id=lease_id), timeout=5
            )
            await stub.ReturnWorkerLease(
                node_manager_pb2.ReturnWorkerLeaseRequest(lease_id=lease_id), timeout=5
            )
        raise
    _count_reply(reply, result, detached=False)
    if not reply.HasField("worker_address"):
        return
    result.ran_on[address] += 1
    try:
        await asyncio.sleep(task.seconds)
    finally:
        # NOT_FOUND: the raylet's own hold timer freed it first (same moment)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.ReturnWorkerLease(
                node_manager_pb2.ReturnWorkerLeaseRequest(
                    lease_id=lease_id, worker_port=reply.worker_address.port
                ),
                timeout=5,
            )
        result.returned += 1


async def _await_or_move(
    call: asyncio.Future[node_manager_pb2.RequestWorkerLeaseReply],
    stub: ServiceStub,
    lease_id: bytes,
    task: TaskSpec,
    address: str,
    finder: RoomFinder | None,
    respill_s: float,
) -> tuple[node_manager_pb2.RequestWorkerLeaseReply | None, str | None]:
    """The lease reply, or (None, another node) once the queued request was withdrawn."""
    try:
        while True:
            done, _ = await asyncio.wait({call}, timeout=respill_s if finder else None)
            if done:
                return call.result(), None
            assert finder is not None
            target = await finder.node_with_room(task, exclude=address)
            if target is None:
                continue
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.CancelWorkerLease(
                    node_manager_pb2.CancelWorkerLeaseRequest(lease_id=lease_id), timeout=5
                )
            reply = await call
            if reply.canceled and not reply.HasField("worker_address"):
                return None, target
            return reply, None  # a grant crossed the withdrawal: keep it
    except asyncio.CancelledError:
        call.cancel()
        raise


def _count_reply(
    reply: node_manager_pb2.RequestWorkerLeaseReply, result: SubmitResult, *, detached: bool
) -> None:
    if reply.rejected:
        result.rejected += 1
    elif reply.canceled:
        result.canceled += 1
    elif reply.HasField("worker_address"):
        result.granted += 1
    elif detached:
        result.queued += 1
