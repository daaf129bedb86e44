"""After a restart every known raylet is told ``NotifyGCSRestart``: the outcome is one log
line for the fleet (a 10,000-node restart wrote 10,000 info lines), each raylet's at debug."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from structlog.testing import capture_logs

from gcs.clock import FakeClock
from gcs.managers.nodes import NodeManager
from gcs.managers.restart_notice import RestartNotice
from gcs.proto import gcs_pb2
from gcs.store.memory import MemoryStore
from gcs.testing.raylets import FakeRayletGateway


async def _serving() -> None:
    return None


async def _released(node: Any) -> None:
    return None


async def test_the_fleets_notices_are_one_summary_line_naming_the_failures() -> None:
    store, clock, raylets = MemoryStore(), FakeClock(), FakeRayletGateway()
    before = NodeManager(store, clock)
    ids = [bytes([n]) * 28 for n in range(1, 13)]
    for n, node_id in enumerate(ids):
        await before.register(
            gcs_pb2.GcsNodeInfo(
                node_id=node_id, node_manager_address="127.0.0.2", node_manager_port=4000 + n
            )
        )
    raylets.unreachable.update(ids[:7])
    nodes = NodeManager(store, clock)  # the restarted GCS
    await nodes.load()
    notice = RestartNotice(
        nodes,
        SimpleNamespace(spread_first_polls=lambda times: None),  # type: ignore[arg-type]
        raylets,
        SimpleNamespace(release_unused_workers=_released),  # type: ignore[arg-type]
        clock,
        contacts_per_s=100,
        max_concurrent=4,
        serving=_serving,
    )
    await notice.load()
    with capture_logs() as logs:
        run = asyncio.create_task(notice.run())
        await clock.advance_until(run.done, 0.01)
        await run
    assert raylets.calls_to("NotifyGCSRestart") and notice.notified == 12
    info = [e for e in logs if e["log_level"] == "info"]
    (summary,) = info
    assert summary["event"] == "raylet.restart_notices"
    assert summary["notified"] == 5 and summary["failed"] == 7
    assert len(summary["first_failures"]) == 5
    assert all(k in {i.hex() for i in ids[:7]} for k in summary["first_failures"])
    assert sum(e["event"] == "raylet.notify_failed" for e in logs) == 7  # at debug
