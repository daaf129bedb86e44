"""The partition suite, large (issue 29): three ``gcs serve --ha`` members on one Redis, each
behind its own TCP proxy (``gcs.testing.netproxy``), clients on the shared GCS address.

Per scenario and round: clients run (InternalKV on a few hot keys, recorded for the
linearizability checker; jobs added and finished, read back for the monotonic check), the
fault hits the current leader (or a standby), holds ``--fault-s``, heals, and the clients
run on a while.  Printed per scenario: rounds, operations, violations (KV linearizability
+ monotonic job states), unknown outcomes (answered "may have been applied" or a dropped
connection), outage (the longest gap between two answered calls around the fault: last
answer -> first answer), stranded calls (no answer before the client's own deadline).

    python -m bench.ha.partitions [--rounds 2] [--scenarios blackhole,one-way-1.5s,...]

Must show on the default lease (2000/500 ms): 0 violations, outage <= TTL + 0.5 s,
0 stranded calls.  Logs are kept (path printed) when a scenario misses.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import pathlib
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from gcs.proto import gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.testing.ha_group import FAST_RECONNECT, GrpcKv, HaGroup, HaMember, definitely_failed
from gcs.testing.linearizability import History, Workload, check
from gcs.testing.monotonic import MonotonicCheck
from gcs.testing.netproxy import TcpProxy
from gcs.testing.ports import free_port
from gcs.testing.redis_server import RedisServer

SCENARIOS = ("blackhole", "one-way-1.5s", "latency-1.5s", "latency-3s", "slow-standby", "sigstop")
CLIENT_DEADLINE_S = 10.0


@dataclass
class Tally:
    rounds: int = 0
    operations: int = 0
    violations: int = 0
    unknown: int = 0
    stranded: int = 0
    outages: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Clients:
    """KV workload + job monotonic client; every answered call's time is kept."""

    def __init__(self, address: str, seed: int) -> None:
        self.kv = GrpcKv(address, timeout_s=CLIENT_DEADLINE_S)
        self.channel = grpc.aio.insecure_channel(address, options=FAST_RECONNECT)
        self.jobs = ServiceStub(self.channel, svc.JOB_INFO, timeout_s=CLIENT_DEADLINE_S)
        self.history = History()
        self.states = MonotonicCheck()
        self.answers: list[float] = []
        self.unknown = 0
        self.stranded = 0
        self.stop = False
        self.seed = seed
        self._job = seed * 100_000
        self.job_calls = 0

    async def _kv_error(self, err: BaseException) -> None:
        self._error(err)
        await asyncio.sleep(0.02)

    def _error(self, err: BaseException) -> None:
        if isinstance(err, grpc.aio.AioRpcError):
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.stranded += 1
            elif not definitely_failed(err):
                self.unknown += 1

    async def run(self) -> None:
        workload = Workload(
            clients=4, keys=4, delete_keys=1, seed=self.seed, namespace=b"lin-%d" % self.seed
        )
        kv = _Timed(self.kv, self.answers)
        await asyncio.gather(
            workload.run(
                kv,  # type: ignore[arg-type]
                self.history,
                stop=lambda: self.stop,
                failed_if=definitely_failed,
                on_error=self._kv_error,
            ),
            self._jobs(),
        )

    async def _jobs(self) -> None:
        live: list[bytes] = []
        while not self.stop:
            self._job += 1
            job_id = self._job.to_bytes(4, "big")
            try:
                if len(live) < 3:
                    t0 = time.monotonic()
                    await self.jobs.AddJob(
                        G.AddJobRequest(data=gcs_pb2.JobTableData(job_id=job_id))
                    )
                    self.states.acked("job", job_id, 1, t0, time.monotonic())
                    live.append(job_id)
                else:
                    done = live.pop(0)
                    t0 = time.monotonic()
                    await self.jobs.MarkJobFinished(G.MarkJobFinishedRequest(job_id=done))
                    self.states.acked("job", done, 2, t0, time.monotonic())
                t0 = time.monotonic()
                known = self.states.known_before("job", t0)
                reply = await self.jobs.GetAllJobInfo(G.GetAllJobInfoRequest())
                t1 = time.monotonic()
                self.answers.append(t1)
                self.job_calls += 2
                seen = {j.job_id: 2 if j.is_dead else 1 for j in reply.job_info_list}
                for key in known:
                    self.states.read("job", key, seen.get(key, 0), t0, t1)
            except grpc.aio.AioRpcError as err:
                self._error(err)
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        await self.kv.close()
        await self.channel.close()


class _Timed:
    def __init__(self, kv: GrpcKv, answers: list[float]) -> None:
        self._kv, self._answers = kv, answers

    async def put(self, namespace: bytes, key: bytes, value: bytes, *, overwrite: bool) -> bool:
        out = await self._kv.put(namespace, key, value, overwrite=overwrite)
        self._answers.append(time.monotonic())
        return out

    async def get(self, namespace: bytes, key: bytes) -> bytes | None:
        out = await self._kv.get(namespace, key)
        self._answers.append(time.monotonic())
        return out

    async def delete(self, namespace: bytes, key: bytes, *, by_prefix: bool) -> int:
        out = await self._kv.delete(namespace, key, by_prefix=by_prefix)
        self._answers.append(time.monotonic())
        return out


def _longest_gap(answers: list[float], since: float) -> float:
    times = sorted(t for t in answers if t >= since - 0.5)
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def _wait_leader(group: HaGroup, timeout_s: float = 60.0) -> HaMember:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leaders = group.leaders()
        if len(leaders) == 1:
            return leaders[0]
        await asyncio.sleep(0.1)
    raise TimeoutError("no single leader")


async def one_round(
    scenario: str,
    group: HaGroup,
    proxies: dict[str, TcpProxy],
    tally: Tally,
    args: argparse.Namespace,
    seed: int,
) -> None:
    leader = await _wait_leader(group)
    for member in group.members:  # every member up (a stalled one was ended last round)
        if member.proc is None or member.proc.poll() is not None:
            member.start()
            member.wait_for("ha.standby", count=member.count("ha.standby") + 1)
    clients = Clients(group.address, seed)
    running = asyncio.ensure_future(clients.run())
    await asyncio.sleep(args.warm_s)
    standbys = [m for m in group.members if m is not leader]
    fault_at = time.monotonic()
    proxy = proxies[leader.name]
    if scenario == "blackhole":
        proxy.blackhole()
    elif scenario == "one-way-1.5s":
        proxy.latency(1.5, 0.0)
    elif scenario == "latency-1.5s":
        proxy.latency(1.5, 1.5)
    elif scenario == "latency-3s":
        proxy.latency(3.0, 3.0)
    elif scenario == "slow-standby":
        proxies[standbys[0].name].latency(1.5, 1.5)
        await asyncio.sleep(1.0)  # its reads are slow before the leader goes
        fault_at = time.monotonic()
        proxy.blackhole()
    elif scenario == "sigstop":
        leader.signal(signal.SIGSTOP)
    await asyncio.sleep(args.fault_s)
    for p in proxies.values():
        p.heal()
    if scenario == "sigstop" and leader.proc is not None and leader.proc.poll() is None:
        leader.signal(signal.SIGCONT)
    await asyncio.sleep(args.after_s)
    clients.stop = True
    await running
    await clients.close()
    result = check(clients.history.operations)
    violations = len(result.violations) + len(clients.states.violations())
    tally.rounds += 1
    tally.operations += len(clients.history.operations) + clients.job_calls
    tally.violations += violations
    tally.unknown += clients.unknown
    tally.stranded += clients.stranded
    tally.outages.append(_longest_gap(clients.answers, fault_at))
    if violations:
        tally.notes += [str(v) for v in result.violations][:2] + clients.states.violations()[:2]


async def suite(
    args: argparse.Namespace, report: Callable[[str, Tally], None] = lambda *_: None
) -> tuple[dict[str, Tally], pathlib.Path]:
    """Every scenario's tally (``report`` after each) and the logs' directory."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="ha-partitions-"))
    redis = RedisServer(appendfsync="everysec").start()
    proxies = {name: TcpProxy("127.0.0.1", redis.port).start() for name in args.members}
    group = HaGroup(redis.url, free_port(), directory)
    env = {"GCS_HA_LEASE_TTL_MS": str(args.ttl_ms), "GCS_HA_RENEW_INTERVAL_MS": str(args.renew_ms)}
    for name in args.members:
        member = HaMember(
            name,
            proxies[name].url(),
            group.port,
            group.namespace,
            directory / f"{name}.log",
            env={**env, "GCS_HA_LOCK_DIR": str(directory / "locks")},
        )
        group.members.append(member.start())
    tallies: dict[str, Tally] = {}
    try:
        for m in group.members:
            m.wait_for("ha.standby", timeout_s=120)
        for n, scenario in enumerate(args.scenarios):
            tally = tallies[scenario] = Tally()
            for r in range(args.rounds):
                await one_round(scenario, group, proxies, tally, args, seed=n * 100 + r)
            report(scenario, tally)
    finally:
        group.stop()
        for p in proxies.values():
            p.stop()
        redis.cleanup()
    return tallies, directory


def met(tally: Tally, ttl_ms: int) -> bool:
    """The issue's must-show: 0 violations, outage <= TTL + 0.5 s, 0 stranded calls."""
    worst = max(tally.outages, default=0.0)
    return tally.violations == 0 and worst <= ttl_ms / 1000 + 0.5 and tally.stranded == 0


async def run(args: argparse.Namespace) -> None:
    print(f"lease ttl {args.ttl_ms} ms, renew every {args.renew_ms} ms; load {os.getloadavg()}")
    print(
        f"{'scenario':<14} {'rounds':>6} {'ops':>7} {'violations':>10} {'unknown':>8} "
        f"{'outage max (s)':>14} {'outages (s)':<24} {'stranded':>8}"
    )

    def report(scenario: str, tally: Tally) -> None:
        worst = max(tally.outages, default=0.0)
        outages = ",".join(f"{o:.2f}" for o in tally.outages)
        print(
            f"{scenario:<14} {tally.rounds:>6} {tally.operations:>7} {tally.violations:>10} "
            f"{tally.unknown:>8} {worst:>14.2f} {outages:<24} {tally.stranded:>8}"
            f"{'' if met(tally, args.ttl_ms) else '  MISSED'}",
            flush=True,
        )
        for note in tally.notes:
            print("   ", note.replace("\n", "\n    "))

    tallies, directory = await suite(args, report)
    missed = not all(met(t, args.ttl_ms) for t in tallies.values())
    bound = args.ttl_ms / 1000 + 0.5
    print(f"bound: outage <= {bound:.1f} s; load {os.getloadavg()}")
    if missed:
        print(f"MISSED: logs kept in {directory}")
    else:
        _remove(directory)


def _remove(directory: pathlib.Path) -> None:
    for path in sorted(directory.rglob("*"), reverse=True):
        if path.is_dir():
            path.rmdir()
        else:
            path.unlink()
    directory.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    split: Callable[[str], list[str]] = lambda s: s.split(",")  # noqa: E731
    parser.add_argument("--scenarios", type=split, default=list(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--members", type=split, default=["a", "b", "c"])
    parser.add_argument("--ttl-ms", type=int, default=2000)
    parser.add_argument("--renew-ms", type=int, default=500)
    parser.add_argument("--warm-s", type=float, default=1.5)
    parser.add_argument("--fault-s", type=float, default=6.0)
    parser.add_argument("--after-s", type=float, default=4.0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
