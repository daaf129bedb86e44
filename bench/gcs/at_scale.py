"""Actors and placement groups at scale without worker processes: our GCS against Ray 2.60's
``gcs_server``, served by the same fake raylets and fake core workers, same run.

    .venv/bin/python -m bench.gcs.at_scale [--actors 10000] [--groups 1000] [--nodes 50]
        [--concurrency 50] [--servers ours,ray] [--servers base,ours --base-tree CHECKOUT]

Ray's release "many actors" / "many placement groups" shapes, scaled to one machine.  For
each GCS in turn (``gcs serve``, memory store; Ray's ``gcs_server`` from the cached 2.60
wheel, its defaults), this process runs:

* ``--nodes`` raylet agents (:mod:`gcs.raylet.fleet`: they register, keep Ray's syncer
  stream, answer health checks and ``GetResourceLoad``, grant ``RequestWorkerLease``, hold
  ``PrepareBundleResources`` / ``CommitBundleResources`` / ``CancelResourceReserve``-style
  bundle calls and ``KillLocalActor`` as a raylet does), every granted lease naming one fake
  core worker;
* that fake core worker (``CoreWorkerService`` on every loopback address of one port): it
  answers ``PushTask`` (the actor creation task) at once, and as the actors' owner holds
  ``WaitForActorRefDeleted`` open (the owner keeps its references);
* a driver: ``AddJob``, then actors ``RegisterActor`` -> ``CreateActor`` (answered once the
  actor is alive: lease, push, ALIVE) up to ``--actors`` with ``--concurrency`` in flight,
  all ``KillActorViaGcs``; then STRICT_SPREAD groups of two ``{"CPU": 0.01}`` bundles
  ``CreatePlacementGroup`` -> ``WaitPlacementGroupUntilReady`` up to ``--groups``, all
  ``RemovePlacementGroup``.

Printed per GCS and per step of the ramp (at 10 %, 20 %, 50 %, 100 % of the count): the
count reached, GCS CPU per operation in that step (utime+stime from /proc), p50 / p99
latency of the step's operations, the GCS's RSS; flat CPU per operation is the goal.  Then
ours / Ray per step.  ``--py-spy FILE`` records our GCS with py-spy (on PATH) meanwhile.
The machine is shared: the load average is printed; compare CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from bench.gcs.clusters import cpu_s, load_average, memory_kib
from bench.pubsub.vs_ray import ray_gcs_server_binary, start_ray
from gcs.proto import common_pb2, gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.raylet.fleet import FleetConfig, RayletFleet
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.server.logging import configure_logging
from gcs.testing.ports import free_port

JOB = (7).to_bytes(4, "little")
STEPS = (0.1, 0.2, 0.5, 1.0)


class FakeCoreWorker(grpc.GenericRpcHandler):
    """Every actor's worker and their owner, any ``ray.rpc.CoreWorkerService`` method on raw
    bytes (an empty reply is each reply message's default): creation pushes succeed at once;
    the owner's references are never deleted (``WaitForActorRefDeleted`` stays open)."""

    SERVICE = "/ray.rpc.CoreWorkerService/"

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._never = asyncio.Event()

    def release(self) -> None:
        """Answer the held calls (the owner is going away)."""
        self._never.set()

    def service(self, handler_call_details: Any) -> Any:
        method: str = handler_call_details.method
        if not method.startswith(self.SERVICE):
            return None
        name = method[len(self.SERVICE) :]

        async def answer(request: bytes, context: Any) -> bytes:
            self.calls[name] += 1
            if name == "WaitForActorRefDeleted":
                await self._never.wait()
            return b""

        return grpc.unary_unary_rpc_method_handler(answer)


@dataclass
class Step:
    phase: str
    count: int
    ops: int
    cpu_s: float
    latencies_s: list[float]
    rss_mib: float
    views_sent: int = 0
    """RESOURCE_VIEW messages the raylets sent in the step."""
    views_relayed: int = 0
    """Views the raylets received from the GCS (other nodes' views) in the step."""

    @property
    def cpu_ms_per_op(self) -> float:
        return 1000 * self.cpu_s / max(self.ops, 1)

    def latency_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def actor_spec(actor_id: bytes, owner: common_pb2.Address) -> common_pb2.TaskSpec:
    spec = common_pb2.TaskSpec(
        type=common_pb2.ACTOR_CREATION_TASK,
        language=common_pb2.PYTHON,
        job_id=JOB,
        task_id=bytes(8) + actor_id,
        parent_task_id=bytes(24),
        caller_id=bytes(24),
        caller_address=owner,
        num_returns=1,
    )
    descriptor = spec.function_descriptor.python_function_descriptor
    descriptor.module_name, descriptor.class_name = "bench", "A"
    descriptor.function_name = "__init__"
    spec.scheduling_strategy.default_scheduling_strategy.SetInParent()
    creation = spec.actor_creation_task_spec
    creation.actor_id = actor_id
    creation.max_concurrency = 1
    creation.ray_namespace = "bench"
    return spec


def group_spec(group_id: bytes) -> common_pb2.PlacementGroupSpec:
    spec = common_pb2.PlacementGroupSpec(
        placement_group_id=group_id,
        strategy=common_pb2.STRICT_SPREAD,
        creator_job_id=JOB,
        creator_actor_dead=True,
    )
    for index in range(2):
        bundle = spec.bundles.add()
        bundle.bundle_id.placement_group_id = group_id
        bundle.bundle_id.bundle_index = index
        bundle.unit_resources["CPU"] = 0.01
    return spec


class World:
    """The fakes and the driver against one GCS."""

    def __init__(self, address: str, gcs_pid: int, nodes: int, concurrency: int) -> None:
        self.address = address
        self.gcs_pid = gcs_pid
        self.nodes = nodes
        self.concurrency = concurrency
        self.worker = FakeCoreWorker()
        self.steps: list[Step] = []
        self.fleet: RayletFleet | None = None

    async def run(self, actors: int, groups: int) -> list[Step]:
        worker_port = free_port()
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((self.worker,))
        server.add_insecure_port(f"0.0.0.0:{worker_port}")
        await server.start()
        fleet = RayletFleet(
            FleetConfig(
                self.address,
                count=self.nodes,
                resources={"CPU": 8.0},
                node_type="cpu8",
                name_prefix="scale",
                worker_port=worker_port,
            )
        )
        channel = grpc.aio.insecure_channel(self.address)
        self.fleet = fleet
        try:
            await fleet.start()
            await self._stubs(channel)
            owner = common_pb2.Address(
                node_id=fleet.agents[0].node_id,
                ip_address="127.0.0.1",
                port=worker_port,
                worker_id=os.urandom(28),
            )
            await self.jobs.AddJob(
                G.AddJobRequest(
                    data=gcs_pb2.JobTableData(
                        job_id=JOB,
                        driver_address=owner,
                        driver_pid=os.getpid(),
                        driver_ip_address="127.0.0.1",
                        start_time=int(time.time() * 1000),
                        config=common_pb2.JobConfig(ray_namespace="bench"),
                    )
                )
            )
            await asyncio.sleep(8)  # registration settles, first health checks pass
            await self._actors(actors, owner)
            await self._groups(groups)
        finally:
            self.worker.release()
            await channel.close()
            await fleet.stop()
            await server.stop(1)
        return self.steps

    async def _stubs(self, channel: grpc.aio.Channel) -> None:
        reply = await ServiceStub(channel, svc.NODE_INFO).GetClusterId(G.GetClusterIdRequest())
        meta = [("ray_cluster_id", reply.cluster_id.hex())]
        self.actors = ServiceStub(channel, svc.ACTOR_INFO, metadata=meta, timeout_s=600)
        self.groups = ServiceStub(channel, svc.PLACEMENT_GROUP_INFO, metadata=meta, timeout_s=600)
        self.jobs = ServiceStub(channel, svc.JOB_INFO, metadata=meta, timeout_s=600)

    async def _step(
        self, phase: str, items: list[bytes], done: int, op: Callable[[bytes], Awaitable[None]]
    ) -> None:
        """``op`` on each of ``items``, ``--concurrency`` at a time; one :class:`Step`."""
        latencies: list[float] = []
        queue = iter(items)

        async def lane() -> None:
            for item in queue:
                start = time.perf_counter()
                await op(item)
                latencies.append(time.perf_counter() - start)

        before = cpu_s(self.gcs_pid)
        sent, relayed = self._views()
        await asyncio.gather(*(lane() for _ in range(self.concurrency)))
        await asyncio.sleep(0.5)  # what the replies left to do (publishes) is in the step
        used = cpu_s(self.gcs_pid) - before
        rss = memory_kib(self.gcs_pid)[0] / 1024
        sent_after, relayed_after = self._views()
        step = Step(
            phase, done, len(items), used, latencies, rss,
            sent_after - sent, relayed_after - relayed,
        )  # fmt: skip
        self.steps.append(step)
        ops = max(len(items), 1)
        print(
            f"  {phase:14} {done:6d}  {step.cpu_ms_per_op:7.3f} ms/op  "
            f"p50 {step.latency_ms(0.5):7.1f} ms  p99 {step.latency_ms(0.99):7.1f} ms  "
            f"rss {rss:6.1f} MiB  views sent {step.views_sent / ops:5.2f}/op "
            f"relayed {step.views_relayed / ops:6.1f}/op  ({load_average()})",
            flush=True,
        )

    def _views(self) -> tuple[int, int]:
        """(views the fleet's raylets sent, views they received), so far."""
        links = [a.syncer for a in self.fleet.agents] if self.fleet is not None else []
        stats = [link.stats for link in links if link is not None]
        return sum(s.sent for s in stats), sum(s.received for s in stats)

    async def _actors(self, total: int, owner: common_pb2.Address) -> None:
        ids = [os.urandom(12) + JOB for _ in range(total)]

        async def create(actor_id: bytes) -> None:
            spec = actor_spec(actor_id, owner)
            reply = await self.actors.RegisterActor(G.RegisterActorRequest(task_spec=spec))
            _check(reply, "RegisterActor")
            reply = await self.actors.CreateActor(G.CreateActorRequest(task_spec=spec))
            _check(reply, "CreateActor")

        async def kill(actor_id: bytes) -> None:
            request = G.KillActorViaGcsRequest(actor_id=actor_id, force_kill=True, no_restart=True)
            _check(await self.actors.KillActorViaGcs(request), "KillActorViaGcs")

        await self._ramp("actor create", ids, create)
        await self._ramp("actor kill", ids, kill)

    async def _groups(self, total: int) -> None:
        ids = [os.urandom(14) + JOB for _ in range(total)]

        async def create(group_id: bytes) -> None:
            request = G.CreatePlacementGroupRequest(placement_group_spec=group_spec(group_id))
            _check(await self.groups.CreatePlacementGroup(request), "CreatePlacementGroup")
            wait = G.WaitPlacementGroupUntilReadyRequest(placement_group_id=group_id)
            _check(await self.groups.WaitPlacementGroupUntilReady(wait), "WaitUntilReady")

        async def remove(group_id: bytes) -> None:
            request = G.RemovePlacementGroupRequest(placement_group_id=group_id)
            _check(await self.groups.RemovePlacementGroup(request), "RemovePlacementGroup")

        await self._ramp("pg create", ids, create)
        await self._ramp("pg remove", ids, remove)

    async def _ramp(
        self, phase: str, ids: list[bytes], op: Callable[[bytes], Awaitable[None]]
    ) -> None:
        start = 0
        for fraction in STEPS:
            end = round(len(ids) * fraction)
            if end > start:
                await self._step(phase, ids[start:end], end, op)
            start = end


def _ratio(ours: float, ray: float) -> str:
    return f"{ours / ray:5.2f}x" if ray > 0 else "n/a"


def _check(reply: Any, what: str) -> None:
    if reply.status.code != 0:
        raise RuntimeError(f"{what}: status {reply.status.code} {reply.status.message}")


# -- the GCS processes -------------------------------------------------------------------


@contextlib.contextmanager
def _ours(port: int, log: pathlib.Path, tree: pathlib.Path | None = None) -> Any:
    """Our GCS from this checkout, or (``tree``) from another one: a baseline commit."""
    env = dict(os.environ, PYTHONPATH=str(tree)) if tree is not None else None
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "gcs", "serve", "--host", "127.0.0.1", "--port", str(port),
                "--storage", "memory://", "--metrics-port", "-1", "--log-level", "warning",
            ],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tree, env=env,
        )  # fmt: skip
    try:
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _ray(port: int, log: pathlib.Path) -> Any:
    binary = ray_gcs_server_binary()
    if binary is None:
        raise SystemExit(
            "no Ray gcs_server: build the interop venv (python -m tests.interop.venvs)"
        )
    server = start_ray(port, binary, config={})
    try:
        yield server.pid
    finally:
        logs = sorted(pathlib.Path(server.workdir.name).glob("*gcs_server*"))
        if logs:
            log.write_bytes(logs[-1].read_bytes()[-200_000:])
        server.stop()


async def _serving(address: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        while True:
            try:
                await ServiceStub(channel, svc.NODE_INFO, timeout_s=2).GetClusterId(
                    G.GetClusterIdRequest()
                )
                return
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)


def run_side(name: str, args: argparse.Namespace, logs: pathlib.Path) -> list[Step]:
    port = free_port()
    log = logs / f"{name}-gcs.log"
    if name == "base":
        if args.base_tree is None:
            raise SystemExit("--servers base needs --base-tree (a checkout of the baseline)")
        server = _ours(port, log, args.base_tree)
    else:
        server = _ours(port, log) if name == "ours" else _ray(port, log)
    print(f"{name}: {args.nodes} fake raylets; {load_average()}", flush=True)
    with server as pid:
        world = World(f"127.0.0.1:{port}", pid, args.nodes, args.concurrency)

        async def go() -> list[Step]:
            await _serving(world.address)
            return await world.run(args.actors, args.groups)

        profiler = None
        if args.py_spy is not None and name == "ours":
            profiler = subprocess.Popen(
                ["py-spy", "record", "-p", str(pid), "-o", str(args.py_spy), "-r", "50",
                 "--nonblocking", "--format", args.py_spy_format],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            steps = asyncio.run(go())
        finally:
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                profiler.wait(120)
        print(f"  core-worker calls from the GCS: {dict(world.worker.calls)}", flush=True)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--actors", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument(
        "--servers", default="ours,ray", help="in turn, of ours, ray, base (see --base-tree)"
    )
    parser.add_argument(
        "--base-tree",
        type=pathlib.Path,
        default=None,
        help="a checkout (protos generated) whose GCS runs as 'base': a same-run baseline",
    )
    parser.add_argument(
        "--py-spy", type=pathlib.Path, default=None, help="profile our GCS with py-spy into FILE"
    )
    parser.add_argument("--py-spy-format", default="flamegraph", help="py-spy's --format")
    args = parser.parse_args()
    configure_logging("auto", "warning", cache=False)
    logs = pathlib.Path(__import__("tempfile").mkdtemp(prefix="at-scale-"))
    results: dict[str, list[Step]] = {}
    failed = False
    try:
        for name in args.servers.split(","):
            results[name] = run_side(name, args, logs)
    except BaseException as exc:
        failed = True
        print(f"failed: {type(exc).__name__}: {exc}; logs kept in {logs}", file=sys.stderr)
        raise
    finally:
        if not failed:
            for path in logs.iterdir():
                path.unlink()
            logs.rmdir()
    for other in [n for n in results if n != "ours"]:
        if "ours" in results:
            _compare(results["ours"], results[other], other)


def _compare(mine: list[Step], theirs: list[Step], other: str) -> None:
    print(f"\nours / {other} per step (GCS CPU per operation; p50 latency); {load_average()}")
    print(
        f"{'phase':14} {'count':>6} {'ours ms/op':>10} {other + ' ms/op':>10} {'cpu':>6} "
        f"{'p50 ours':>9} {'p50 ' + other:>8} {'rss ours':>9} {'rss ' + other:>8} "
        f"{'relayed/op ours':>15} {other:>6}"
    )
    for ours, them in zip(mine, theirs, strict=False):
        print(
            f"{ours.phase:14} {ours.count:6d} {ours.cpu_ms_per_op:10.3f} "
            f"{them.cpu_ms_per_op:10.3f} "
            f"{_ratio(ours.cpu_ms_per_op, them.cpu_ms_per_op):>6} "
            f"{ours.latency_ms(0.5):9.1f} {them.latency_ms(0.5):8.1f} "
            f"{ours.rss_mib:9.1f} {them.rss_mib:8.1f} "
            f"{ours.views_relayed / max(ours.ops, 1):15.1f} "
            f"{them.views_relayed / max(them.ops, 1):6.1f}"
        )
    for phase in dict.fromkeys(s.phase for s in mine):
        o = [s.cpu_ms_per_op for s in mine if s.phase == phase]
        r = [s.cpu_ms_per_op for s in theirs if s.phase == phase]
        if not o or not r:
            continue
        print(
            f"{phase}: last step / first step CPU per op: ours {o[-1] / max(o[0], 1e-9):.2f}, "
            f"{other} {r[-1] / max(r[0], 1e-9):.2f}; mean ours {statistics.mean(o):.3f} ms, "
            f"{other} {statistics.mean(r):.3f} ms"
        )


if __name__ == "__main__":
    main()
