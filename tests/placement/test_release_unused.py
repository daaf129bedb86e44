"""A restart's ReleaseUnusedBundles fan-out: every alive raylet once, with a bounded number
of calls started at a time (not one task per node in the tick after the port binds)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gcs.managers import bundle_reservations
from gcs.managers.bundle_reservations import BundleReservations
from gcs.managers.nodes import NodeManager
from gcs.proto import common_pb2, gcs_pb2
from gcs.rpc.raylet_io.gateway import RayletGateway


class _Gateway:
    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.released: dict[bytes, list[common_pb2.Bundle]] = {}

    async def release_unused_bundles(
        self, node_id: bytes, address: str, in_use: Sequence[common_pb2.Bundle], timeout_s: float
    ) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0)
        self.released[node_id] = list(in_use)
        self.in_flight -= 1


async def test_every_alive_raylet_is_told_once_with_bounded_concurrency(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bundle_reservations, "RELEASE_WORKERS", 8)
    alive = {
        n.to_bytes(4, "big"): gcs_pb2.GcsNodeInfo(
            node_id=n.to_bytes(4, "big"), node_manager_address="127.0.0.1", node_manager_port=n
        )
        for n in range(1, 301)
    }
    gateway = _Gateway()
    nodes: Any = SimpleNamespace(alive=alive)
    reservations = BundleReservations(
        cast(RayletGateway, gateway), cast(NodeManager, nodes), timeout_s=1.0
    )
    bundle = common_pb2.Bundle()
    await reservations.release_unused({b"\x00\x00\x00\x07": [bundle]})
    assert set(gateway.released) == set(alive)
    assert gateway.released[b"\x00\x00\x00\x07"] == [bundle]
    assert gateway.most <= 8
