"""Busy clients of an HA group for handover tests and ``bench/ha/handover.py``: every call
recorded (when it was answered, or how it failed), no retry of our own.

Each client has its own channel (its own connection, ``grpc.use_local_subchannel_pool``)
with gRPC's defaults otherwise: a call refused with REFUSED_STREAM or sent after a GOAWAY is
retried by gRPC itself (transparent retry), nothing more.  The *pause* of a handover is the
longest time between two consecutive answers (any client) around it: the last answer of
the old leader to the first of the new one.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

import grpc

from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc

__all__ = ["BusyClients", "CallFailure"]

CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class CallFailure:
    at: float
    method: str
    code: str
    details: str


@dataclass
class BusyClients:
    """``clients`` loops of calls (a KV put, then a cluster-id read, ...) to ``address``."""

    address: str
    clients: int = 5
    answered: list[float] = field(default_factory=list)
    """Monotonic times of every answer, in order."""
    failures: list[CallFailure] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _channels: list[grpc.aio.Channel] = field(default_factory=list)

    async def start(self) -> BusyClients:
        for n in range(self.clients):
            channel = grpc.aio.insecure_channel(
                self.address, options=(("grpc.use_local_subchannel_pool", 1),)
            )
            self._channels.append(channel)
            self._tasks.append(asyncio.create_task(self._loop(n, channel)))
        return self

    @property
    def calls(self) -> int:
        return len(self.answered) + len(self.failures)

    async def until_answered(self, more: int, timeout_s: float = 60.0) -> None:
        """Until ``more`` further calls were answered."""
        want = len(self.answered) + more
        deadline = time.monotonic() + timeout_s
        while len(self.answered) < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{want - len(self.answered)} calls unanswered in {timeout_s} s")
            await asyncio.sleep(0.01)

    def pause_s(self, since: float, until: float) -> float:
        """Longest gap between consecutive answers that overlaps ``[since, until]``."""
        times = [t for t in self.answered]
        longest = 0.0
        for before, after in itertools.pairwise(times):
            if after >= since and before <= until:
                longest = max(longest, after - before)
        return longest

    async def _loop(self, n: int, channel: grpc.aio.Channel) -> None:
        kv = ServiceStub(channel, svc.INTERNAL_KV, timeout_s=CALL_TIMEOUT_S)
        nodes = ServiceStub(channel, svc.NODE_INFO, timeout_s=CALL_TIMEOUT_S)
        for i in itertools.count():
            if self._stop.is_set():
                return
            method = "InternalKVPut" if i % 2 == 0 else "GetClusterId"
            try:
                if i % 2 == 0:
                    reply = await kv.InternalKVPut(
                        G.InternalKVPutRequest(
                            namespace=b"load", key=b"c%d" % n, value=b"%d" % i, overwrite=True
                        )
                    )
                    if reply.status.code != 0:
                        raise _Refused(reply.status.message)
                else:
                    await nodes.GetClusterId(G.GetClusterIdRequest())
            except grpc.aio.AioRpcError as err:
                self.failures.append(
                    CallFailure(time.monotonic(), method, err.code().name, err.details() or "")
                )
                await asyncio.sleep(0.01)
                continue
            except _Refused as err:
                self.failures.append(CallFailure(time.monotonic(), method, "REPLY", str(err)))
                continue
            self.answered.append(time.monotonic())

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._channels:
            await channel.close()


class _Refused(Exception):
    pass
