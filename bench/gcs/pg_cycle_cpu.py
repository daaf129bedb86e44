"""GCS CPU per placement-group cycle, our GCS builds side by side, without Ray processes.

    .venv/bin/python -m bench.gcs.pg_cycle_cpu [--base DIR] [--uv] [--groups 300] [--rounds 5]

Each build is ``gcs serve`` (memory store) with two ``gcs raylet`` agents (4 CPUs each) on
its own loopback address and free ports; ``ours`` is this checkout, ``base`` another one
(``--base``: e.g. ``git archive main`` unpacked), ``uv`` this checkout on uvloop.  This
process then runs, per round and build in turn (order rotated), ``--groups`` cycles of
CreatePlacementGroup (two ``{"CPU": 0.01}`` bundles, STRICT_SPREAD) ->
WaitPlacementGroupUntilReady -> RemovePlacementGroup: the GCS's pass, both raylets' prepare
and commit, and the return of the bundles.  Printed per round: the GCS process's CPU
(utime+stime from /proc) per cycle; at the end the median per build and its ratio to the
first.  The machine is shared: compare within one run; the load average is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

from gcs.proto import common_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.testing.ports import free_port

HOSTS = {"base": "127.0.0.13", "ours": "127.0.0.14", "uv": "127.0.0.15"}


def cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Build:
    def __init__(self, name: str, checkout: pathlib.Path | None, logs: pathlib.Path) -> None:
        self.name = name
        self.checkout = checkout
        self.logs = logs
        self.host = HOSTS[name]
        self.port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        if self.checkout is not None:
            env["PYTHONPATH"] = str(self.checkout)
        if self.name == "uv":
            env["GCS_EVENT_LOOP"] = "uvloop"
        proc = subprocess.Popen(
            [sys.executable, "-m", "gcs", *args],
            stdout=(self.logs / f"{self.name}-{log}.log").open("wb"),
            stderr=subprocess.STDOUT, env=env, cwd=self.checkout, start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    async def start(self) -> None:
        self.gcs = self._spawn(
            [
                "serve", "--host", self.host, "--port", str(self.port), "--storage", "memory://",
                "--metrics-port", "-1", "--log-level", "warning",
            ],
            "gcs",
        )  # fmt: skip
        await asyncio.sleep(2)
        for i in range(2):
            self._spawn(
                [
                    "raylet", "--address", self.address, "--host", self.host,
                    "--resources", '{"CPU": 4}', "--register-timeout", "120",
                ],
                f"raylet{i}",
            )  # fmt: skip
        self.channel = grpc.aio.insecure_channel(self.address)
        nodes = ServiceStub(self.channel, svc.NODE_INFO, timeout_s=10)
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await nodes.GetAllNodeInfo(G.GetAllNodeInfoRequest())
                if len(reply.node_info_list) >= 2:
                    break
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise SystemExit(f"{self.name}: did not start; logs in {self.logs}")
            await asyncio.sleep(0.5)
        self.pgs = ServiceStub(self.channel, svc.PLACEMENT_GROUP_INFO, timeout_s=60)
        self.serial = 0

    async def cycles(self, n: int) -> None:
        for _ in range(n):
            self.serial += 1
            pg_id = self.serial.to_bytes(14, "big") + b"\x00\x00\x00\x01"
            spec = common_pb2.PlacementGroupSpec(
                placement_group_id=pg_id,
                strategy=common_pb2.STRICT_SPREAD,
                creator_job_id=b"\x00\x00\x00\x01",
                bundles=[common_pb2.Bundle(unit_resources={"CPU": 0.01}) for _ in range(2)],
            )
            await self.pgs.CreatePlacementGroup(
                G.CreatePlacementGroupRequest(placement_group_spec=spec)
            )
            await self.pgs.WaitPlacementGroupUntilReady(
                G.WaitPlacementGroupUntilReadyRequest(placement_group_id=pg_id)
            )
            await self.pgs.RemovePlacementGroup(
                G.RemovePlacementGroupRequest(placement_group_id=pg_id)
            )

    async def stop(self) -> None:
        with contextlib.suppress(AttributeError):
            await self.channel.close()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=pathlib.Path, default=None)
    parser.add_argument("--uv", action="store_true")
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logs = pathlib.Path(tempfile.mkdtemp(prefix="pg-cycle-"))
    builds = [Build("ours", None, logs)]
    if args.base is not None:
        builds.insert(0, Build("base", args.base.resolve(), logs))
    if args.uv:
        builds.append(Build("uv", None, logs))
    print(f"logs in {logs}", flush=True)
    ok = False
    try:
        for b in builds:
            await b.start()
            await b.cycles(20)  # warm-up
        per: dict[str, list[float]] = {b.name: [] for b in builds}
        for r in range(args.rounds):
            for b in builds[r % len(builds) :] + builds[: r % len(builds)]:
                before = cpu_s(b.gcs.pid)
                await b.cycles(args.groups)
                per[b.name].append(1000 * (cpu_s(b.gcs.pid) - before) / args.groups)
                print(
                    f"round {r} {b.name:4}: {per[b.name][-1]:.3f} ms CPU per group "
                    f"(load1 {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        first = statistics.median(per[builds[0].name])
        for b in builds:
            med = statistics.median(per[b.name])
            print(f"{b.name:4}: median {med:.3f} ms CPU per group  x{med / first:.2f}")
        ok = True
    finally:
        for b in builds:
            await b.stop()
        if ok:
            shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
