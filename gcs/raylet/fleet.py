"""Many raylet agents in one process (tests, demos, benchmarks with thousands of nodes).

Design: every agent keeps its own grpc.aio server on its own port, so the GCS dials, polls
and health-checks each raylet at its ``node_manager_address:port`` exactly as a real one.
One server bound to many addresses cannot work: grpc's Python API does not tell a handler
which address was dialed (verified: no ``:authority`` in the metadata, ``peer()`` is the
client's address) and GetResourceLoad's request is empty.  Servers themselves are cheap
(no threads; all grpc.aio servers of a loop share one completion-queue poller); the cost is
per RPC and is the same for one server or many.  Measured with
``scripts/bench_raylet_fleet.py`` on the 2-core dev VM (load poll 1 s + health check 3 s):

* idle: 0 CPU, ~100 MB RSS per 1,000 agents, 1 listening fd per agent (+1 per connection);
* polled: ~0.5 ms of fleet CPU per RPC, i.e. ~0.5 core per 1,000 agents at 1 poll/s
  (~0.65 core with the health checks), ~170 MB RSS and 2 fds per agent; the poller itself
  (a stand-in for the GCS) pays ~0.45 ms per RPC.  One fleet process saturates at ~1,100
  RPC/s, so 2,000 agents need ``--processes 2`` *and* more CPU than a 2-core box has left.

So the grpc.aio-per-agent fleet is right for hundreds of raylets; 2,000 on 2 cores needs a
cheaper transport (see the branch report: one asyncio HTTP/2 listener per address with
pre-encoded replies).  To use more cores, ``run_fleet_processes`` spreads the fleet.

Agents share one channel to the GCS (one connection instead of thousands) and register in
bounded batches.  With ``distinct_ips`` agent *i* binds 127.x.y.z (all of 127/8 is loopback
on Linux) so every raylet also has its own node IP.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from gcs.base.clock import Clock
from gcs.raylet.agent import ExitReason, RayletAgent, RayletConfig
from gcs.rpc.security import Security


@dataclass(frozen=True)
class FleetConfig:
    gcs_address: str
    count: int
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    node_type: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    name_prefix: str = "fleet"
    first_index: int = 0
    """Index of the first agent (names and IPs stay unique across fleet processes)."""
    distinct_ips: bool = False
    liveness_check_interval_ms: int = 60_000
    register_concurrency: int = 64
    syncer: bool = True
    """Every agent keeps Ray's syncer stream (resource view on change), as real raylets do."""
    worker_port: int = 0
    """Port of the (fake) core worker every granted lease names; 0: made-up ports."""
    register_timeout_s: float = 30.0
    """Each agent gives up registering after this long (the GCS is unreachable)."""
    gcs_rpc_server_reconnect_timeout_s: float = 60.0
    """Each agent exits once the GCS has been unreachable this long (Ray's knob)."""


def loopback_ip(index: int) -> str:
    """Agent *index* → 127.0.0.2 + index (127.0.0.1 stays for everything else).

    Only 127.0.0.0 and 127.255.255.255 are special on the /8 loopback route, so octets 0 and
    255 inside the range are ordinary host addresses.
    """
    n = index + 2
    if index < 0 or n >= (1 << 24) - 1:
        raise ValueError(f"no loopback address for index {index}")
    return f"127.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"


class RayletFleet:
    """Starts ``count`` agents; ``stop()`` stops them all (idempotent)."""

    def __init__(self, config: FleetConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self._clock = clock
        self._channel: grpc.aio.Channel | None = None
        self.agents: list[RayletAgent] = []
        self._stopped = False

    def _agent_config(self, index: int) -> RayletConfig:
        cfg = self.config
        host = loopback_ip(index) if cfg.distinct_ips else "127.0.0.1"
        return RayletConfig(
            gcs_address=cfg.gcs_address,
            resources=dict(cfg.resources),
            node_type=cfg.node_type,
            labels=dict(cfg.labels),
            host=host,
            node_name=f"{cfg.name_prefix}-{index}",
            instance_id=f"{cfg.name_prefix}-{index}",
            liveness_check_interval_ms=cfg.liveness_check_interval_ms,
            register_timeout_s=cfg.register_timeout_s,
            gcs_rpc_server_reconnect_timeout_s=cfg.gcs_rpc_server_reconnect_timeout_s,
            subscribe_virtual_clusters=False,
            syncer=cfg.syncer,
            worker_port=cfg.worker_port,
        )

    async def start(self) -> None:
        cfg = self.config
        security = Security.from_env()
        self._channel = security.aio_channel(cfg.gcs_address)
        self.agents = [
            RayletAgent(
                self._agent_config(cfg.first_index + i),
                clock=self._clock,
                gcs_channel=self._channel,
                security=security,
            )
            for i in range(cfg.count)
        ]
        for agent in self.agents:
            await agent.serve()
        gate = asyncio.Semaphore(cfg.register_concurrency)

        async def register(agent: RayletAgent) -> None:
            async with gate:
                await agent.start()

        try:
            await asyncio.gather(*(register(a) for a in self.agents))
        except BaseException:
            await self.stop()
            raise

    async def wait(self) -> list[ExitReason]:
        """Until every agent has exited (drained, shut down, or fleet stopped)."""
        return list(await asyncio.gather(*(a.wait() for a in self.agents)))

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await asyncio.gather(*(a.stop() for a in self.agents), return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()

    async def leave(self) -> None:
        """Every agent unregisters, then the fleet stops (what SIGINT/SIGTERM do)."""
        if self._stopped:
            return
        await asyncio.gather(*(a.leave() for a in self.agents), return_exceptions=True)
        await self.stop()

    def alive(self) -> list[RayletAgent]:
        return [a for a in self.agents if a.exit_reason is None]


def split_counts(count: int, processes: int) -> list[int]:
    base, extra = divmod(count, processes)
    return [base + (1 if i < extra else 0) for i in range(processes)]


async def run_fleet_processes(argv_without_count: Sequence[str], count: int, processes: int) -> int:
    """Run ``count`` raylets over ``processes`` child fleet processes; first failure wins."""
    children = []
    first = 0
    for n in split_counts(count, processes):
        if n == 0:
            continue
        args = [
            sys.executable,
            "-m",
            "gcs.cli.raylet",
            "raylet-fleet",
            *argv_without_count,
            "--count",
            str(n),
            "--first-index",
            str(first),
            "--processes",
            "1",
        ]
        children.append(await asyncio.create_subprocess_exec(*args, env=dict(os.environ)))
        first += n

    def terminate_all() -> None:
        for child in children:
            if child.returncode is None:
                child.terminate()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, terminate_all)  # children must not outlive us
    try:
        codes = await asyncio.gather(*(c.wait() for c in children))
    finally:
        terminate_all()
    return max(codes, default=0)
