"""Busy clients of an HA group for handover tests and ``bench/ha/handover.py``: every call
recorded (when it was answered, or how it failed), no retry of our own.

Each client has its own channel (its own connection, ``grpc.use_local_subchannel_pool``)
with gRPC's defaults otherwise: a call refused with REFUSED_STREAM or sent after a GOAWAY is
retried by gRPC itself (transparent retry), nothing more.  The *pause* of a handover is the
longest time between two consecutive answers (any client) around it: the last answer of
the old leader to the first of the new one; a client's *stall* is the same gap in its own
answers.

:class:`BusyClients` runs every client in this process (one gRPC runtime for all their
connections); :class:`BusyClientProcesses` runs each in a process of its own, as Ray's
raylets and workers are (one GCS connection per process).  The difference matters: when
every connection of a process is told to go away at once, that process's gRPC (grpcio's
EventEngine thread pool, which grows by one thread a second under a backlog) can take a
second or more to handle them all -- a stall of the client, seen with no failed
reconnect.  ``trace`` records each channel's connectivity transitions (a reconnect that
failed shows as TRANSIENT_FAILURE) and how late this process's event loop woke.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import time
from dataclasses import dataclass, field

import grpc

from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc

__all__ = ["BusyClientProcesses", "BusyClients", "CallFailure"]

CALL_TIMEOUT_S = 10.0
LATE_S = 0.02
"""A 5 ms sleep of the event loop waking later than this is recorded (``trace``)."""


@dataclass(frozen=True, slots=True)
class CallFailure:
    at: float
    method: str
    code: str
    details: str


@dataclass
class _Record:
    """What the clients saw: answers, failures and (``trace``) channel transitions."""

    clients: int = 5
    trace: bool = False
    answered: list[float] = field(default_factory=list)
    """Monotonic times of every answer, in order."""
    by_client: list[list[float]] = field(default_factory=list)
    """Per client, the times of its answers."""
    failures: list[CallFailure] = field(default_factory=list)
    states: list[tuple[float, int, str]] = field(default_factory=list)
    """(time, client, its channel's new connectivity state) (``trace``)."""
    late: list[tuple[float, float]] = field(default_factory=list)
    """(time, seconds late) of the clients' event loop (``trace``)."""

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
        return _longest_gap(sorted(self.answered), since, until)

    def stalls_s(self, since: float, until: float) -> list[float]:
        """Per client, its longest gap between two of its answers overlapping the span."""
        return [_longest_gap(times, since, until) for times in self.by_client]

    def failed_reconnects(self, since: float, until: float) -> int:
        """Channels that went TRANSIENT_FAILURE in the span (a connect refused or reset)."""
        return sum(1 for t, _, s in self.states if since <= t <= until and s == "TRANSIENT_FAILURE")


def _longest_gap(times: list[float], since: float, until: float) -> float:
    longest = 0.0
    for before, after in itertools.pairwise(times):
        if after >= since and before <= until:
            longest = max(longest, after - before)
    return longest


class BusyClients(_Record):
    """``clients`` loops of calls (a KV put, then a cluster-id read, ...) to ``address``,
    in this process."""

    def __init__(self, address: str, clients: int = 5, *, trace: bool = False) -> None:
        super().__init__(clients, trace)
        self.address = address
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._channels: list[grpc.aio.Channel] = []

    async def start(self) -> BusyClients:
        for n in range(self.clients):
            channel = grpc.aio.insecure_channel(
                self.address, options=(("grpc.use_local_subchannel_pool", 1),)
            )
            self._channels.append(channel)
            self.by_client.append([])
            self._tasks.append(asyncio.create_task(self._loop(n, channel)))
            if self.trace:
                self._tasks.append(asyncio.create_task(self._watch(n, channel)))
        if self.trace:
            self._tasks.append(asyncio.create_task(self._heartbeat()))
        return self

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
            now = time.monotonic()
            self.answered.append(now)
            self.by_client[n].append(now)

    async def _watch(self, n: int, channel: grpc.aio.Channel) -> None:
        state = channel.get_state()
        while not self._stop.is_set():
            changed = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await channel.wait_for_state_change(state)
                    changed = True
            new = channel.get_state()
            if changed or new != state:  # changed and back (READY, IDLE, READY): recorded
                self.states.append((time.monotonic(), n, new.name))
                state = new

    async def _heartbeat(self) -> None:
        while not self._stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(0.005)
            late_s = time.monotonic() - before - 0.005
            if late_s > LATE_S:
                self.late.append((time.monotonic(), late_s))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._channels:
            await channel.close()


class BusyClientProcesses(_Record):
    """As :class:`BusyClients`, each client in a process of its own (``python -m
    gcs.testing.ha_load ADDRESS``), which reports what it saw on its stdout (monotonic
    times are the host's: comparable across processes)."""

    def __init__(self, address: str, clients: int = 5, *, trace: bool = False) -> None:
        super().__init__(clients, trace)
        self.address = address
        self._procs: list[asyncio.subprocess.Process] = []
        self._readers: list[asyncio.Task[None]] = []

    async def start(self) -> BusyClientProcesses:
        for n in range(self.clients):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gcs.testing.ha_load",
                self.address,
                *(["--trace"] if self.trace else []),
                stdout=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL,
            )
            self._procs.append(proc)
            self.by_client.append([])
            self._readers.append(asyncio.create_task(self._read(n, proc)))
        return self

    async def _read(self, n: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            kind, at, *rest = line.decode().split(" ", 2)
            t = float(at)
            if kind == "A":
                self.answered.append(t)
                self.by_client[n].append(t)
            elif kind == "F":
                method, code, details = [*rest[0].rstrip("\n").split(" ", 2), "", ""][:3]
                self.failures.append(CallFailure(t, method, code, details))
            elif kind == "S":
                self.states.append((t, n, rest[0].strip()))
            elif kind == "L":
                self.late.append((t, float(rest[0])))

    async def stop(self) -> None:
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self._procs:
            await proc.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)


async def _report(address: str, trace: bool) -> None:
    """One client; what it sees, a line each (``A t``, ``F t method code details``,
    ``S t state``, ``L t late_s``), until terminated."""
    clients = await BusyClients(address, clients=1, trace=trace).start()
    sent = [0, 0, 0, 0]
    out = sys.stdout
    while True:
        await asyncio.sleep(0.005)
        lines = [f"A {t:.6f}\n" for t in clients.answered[sent[0] :]]
        lines += [
            f"F {f.at:.6f} {f.method} {f.code} {' '.join(f.details.split())}\n"
            for f in clients.failures[sent[1] :]
        ]
        lines += [f"S {t:.6f} {s}\n" for t, _, s in clients.states[sent[2] :]]
        lines += [f"L {t:.6f} {late:.6f}\n" for t, late in clients.late[sent[3] :]]
        sent = [
            len(clients.answered),
            len(clients.failures),
            len(clients.states),
            len(clients.late),
        ]
        if lines:
            out.write("".join(lines))
            out.flush()


class _Refused(Exception):
    pass


if __name__ == "__main__":
    asyncio.run(_report(sys.argv[1], "--trace" in sys.argv[2:]))
