"""Fleet mode: many individually addressable raylets in one process."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
from pathlib import Path

import grpc
import pytest

from gcs.proto import node_manager_pb2
from gcs.raylet.fleet import FleetConfig, RayletFleet, loopback_ip, split_counts
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import NODE_MANAGER
from tests.conftest import eventually


async def poll_all(fleet: RayletFleet) -> list[bytes]:
    """Dial every raylet at its registered address, as the GCS load puller does."""
    channels = [grpc.aio.insecure_channel(a.address) for a in fleet.agents]
    try:
        stubs = [ServiceStub(c, NODE_MANAGER, timeout_s=20) for c in channels]
        replies = await asyncio.gather(
            *(s.GetResourceLoad(node_manager_pb2.GetResourceLoadRequest()) for s in stubs)
        )
    finally:
        await asyncio.gather(*(c.close() for c in channels))
    return [r.resources.node_id for r in replies]


class TestFleet:
    """Each agent registers and answers at its own address."""

    async def test_two_hundred_agents_register_and_answer_get_resource_load(self, fake_gcs):
        """Every registered node answers with its own node id at its own address."""
        fleet = RayletFleet(FleetConfig(fake_gcs.address, count=200, resources={"CPU": 4}))
        await fleet.start()
        try:
            registered = fake_gcs.servicer.registered
            assert len({n.node_id for n in registered}) == 200
            assert len({(n.node_manager_address, n.node_manager_port) for n in registered}) == 200
            assert await poll_all(fleet) == [a.node_id for a in fleet.agents]
            assert {n.node_name for n in registered} == {f"fleet-{i}" for i in range(200)}
        finally:
            await fleet.stop()

    async def test_distinct_ips_give_every_raylet_its_own_loopback_address(self, fake_gcs):
        """127.x.y.z per agent; the GCS sees distinct node_manager_address values."""
        fleet = RayletFleet(
            FleetConfig(fake_gcs.address, count=20, distinct_ips=True, first_index=300)
        )
        await fleet.start()
        try:
            addresses = {n.node_manager_address for n in fake_gcs.servicer.registered}
            assert addresses == {loopback_ip(300 + i) for i in range(20)}
            assert await poll_all(fleet) == [a.node_id for a in fleet.agents]
        finally:
            await fleet.stop()

    async def test_stop_ends_every_agent(self, fake_gcs):
        """wait() returns once all agents have stopped."""
        fleet = RayletFleet(FleetConfig(fake_gcs.address, count=5))
        await fleet.start()
        await fleet.stop()
        assert len(await asyncio.wait_for(fleet.wait(), 30)) == 5
        assert fleet.alive() == []


class TestAddressing:
    """Pure helpers of the fleet."""

    def test_loopback_ips_are_unique_loopback_addresses(self) -> None:
        """Never 127.0.0.1 (kept for the GCS) and never the /8's network or broadcast."""
        ips = [loopback_ip(i) for i in range(70_000)]
        assert len(set(ips)) == 70_000
        assert ips[0] == "127.0.0.2"
        assert all(ipaddress.ip_address(ip).is_loopback for ip in ips[::997])
        with pytest.raises(ValueError):
            loopback_ip((1 << 24) - 3)

    def test_split_counts_spreads_evenly(self) -> None:
        """K processes share N agents, differing by at most one."""
        assert split_counts(10, 3) == [4, 3, 3]
        assert sum(split_counts(2000, 7)) == 2000


def child_pids(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


class TestProcesses:
    """--processes K spreads the fleet over K child processes and takes them down with it."""

    async def test_fleet_over_three_processes_registers_every_raylet(self, fake_gcs) -> None:
        """30 agents over 3 processes: unique names; no child outlives a terminated parent."""
        parent = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gcs.cli.raylet", "raylet-fleet",
            "--gcs-address", fake_gcs.address, "--count", "30", "--processes", "3",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )  # fmt: skip
        try:
            await fake_gcs.changes.until(lambda: len(fake_gcs.servicer.registered) == 30)
            names = {n.node_name for n in fake_gcs.servicer.registered}
            assert names == {f"fleet-{i}" for i in range(30)}
            children = child_pids(parent.pid)
            assert len(children) == 3
        finally:
            parent.terminate()
            await parent.wait()
        # wall clock: the fleet's children are not ours to wait for; only /proc shows them go
        await eventually(lambda: not any(os.path.exists(f"/proc/{c}") for c in children))
