"""NotifyGCSRestart after a restart or a takeover (``gcs.managers.restart_notice``): spread
over a window at the contact rate that starts once the GCS serves, so the raylets whose
time passed while the GCS loaded do not all arrive in the loop turn after the port binds,
ahead of the GCS's first answers.  The outcome is one log line for the fleet (a 10,000-node
restart wrote 10,000 info lines), each raylet's at debug."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
import structlog
from structlog.testing import capture_logs

from gcs.base.clock import FakeClock
from gcs.managers import restart_notice
from gcs.managers.actors import ActorManager
from gcs.managers.load_poller import LoadPoller
from gcs.managers.nodes import NodeManager
from gcs.managers.restart_notice import RestartNotice
from gcs.proto import gcs_pb2
from gcs.store.base import TABLE_NODE, WriteBatch
from gcs.store.memory import MemoryStore
from gcs.testing.fake_raylets import FakeRayletGateway
from tests.server.known_nodes import register_nodes


async def test_notifications_spread_over_a_window_that_starts_when_the_gcs_serves() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    batch = WriteBatch()
    for n in range(20):
        info = gcs_pb2.GcsNodeInfo(
            node_id=n.to_bytes(28, "big"),
            node_manager_address="127.0.0.1",
            node_manager_port=7000 + n,
            state=gcs_pb2.GcsNodeInfo.ALIVE,
        )
        batch.put(TABLE_NODE, info.node_id, info.SerializeToString())
    await store.write(batch)
    nodes = NodeManager(store, clock)
    await nodes.load()
    raylets = FakeRayletGateway()
    first_polls: dict[bytes, float] = {}
    poller: Any = SimpleNamespace(spread_first_polls=first_polls.update)
    actors: Any = SimpleNamespace(release_unused_workers=lambda node: asyncio.sleep(0))
    serving = asyncio.Event()
    notice = RestartNotice(
        nodes,
        cast(LoadPoller, poller),
        raylets,
        cast(ActorManager, actors),
        clock,
        contacts_per_s=2,  # 20 nodes: a 10 s window
        max_concurrent=100,
        serving=serving.wait,
        rng=random.Random(3),
    )
    t0 = clock.monotonic_s()
    await notice.load()
    assert len(first_polls) == 20 and all(t0 <= t < t0 + 10.0 for t in first_polls.values())
    running = asyncio.create_task(notice.run())

    await clock.advance_until(lambda: clock.monotonic_s() >= t0 + 6.0, 0.5)  # a slow load
    assert not raylets.calls_to("NotifyGCSRestart")
    serving.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(raylets.calls_to("NotifyGCSRestart")) <= 1, "no burst when the port binds"
    await clock.advance_until(lambda: clock.monotonic_s() >= t0 + 11.0, 0.5)
    assert 8 <= len(raylets.calls_to("NotifyGCSRestart")) <= 12, "2 a second from serving"
    await clock.advance_until(running.done, 0.5)
    assert notice.notified == 20


async def _serving() -> None:
    return None


async def _released(node: Any) -> None:
    return None


@pytest.fixture
def fresh_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """structlog's defaults for this test: another test on this worker may have configured a
    level filter (warning) or cached this module's logger, and capture_logs would then see
    no info line."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    monkeypatch.setattr(restart_notice, "log", structlog.get_logger("gcs.restart"))
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.mark.usefixtures("fresh_logging")
async def test_the_fleets_notices_are_one_summary_line_naming_the_failures() -> None:
    store, clock, raylets = MemoryStore(), FakeClock(), FakeRayletGateway()
    ids = await register_nodes(store, clock, 12)
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
