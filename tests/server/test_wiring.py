"""The wiring builds without I/O, subscribes listeners in the documented order, and the
supervisor runs what it built: load before run (a loaded GCS serves nothing), and the first
failure stops every component and is raised as the component raised it."""

from __future__ import annotations

import socket

import pytest

from gcs.base.lifecycle import Supervisor
from gcs.managers.health import HealthChecker
from gcs.proto import gcs_pb2
from gcs.server import GcsServer
from gcs.server.wiring import Wiring
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_NODE
from gcs.store.memory import MemoryStore
from gcs.testing.fake_raylets import FakeRayletGateway
from tests.conftest import fast_config
from tests.server.wiring_support import built_wiring


class _NoIo(MemoryStore):
    """Fails the test on any I/O at all."""

    async def open(self) -> None:
        raise AssertionError("the wiring opened the store")


def _build(store: Store, raylets: FakeRayletGateway | None = None) -> Wiring:
    return built_wiring(store=store, raylets=raylets)


def _names(listeners: object) -> list[str]:
    return [type(listener).__name__ for listener in listeners]  # type: ignore[attr-defined]


def test_listeners_are_subscribed_in_the_documented_order() -> None:
    """The order of docs/architecture.md and of the wiring's docstring."""
    wiring = _build(_NoIo())
    assert _names(wiring.node_events) == [
        "ResourceCache",
        "_ForgetRaylet",
        "HealthChecker",
        "_NodeListener",  # jobs
        "VirtualClusterManager",
        "PlacementGroupScheduler",
        "AutoscalerStateManager",
        "SyncHub",
        "_NodeListener",  # actors
    ]
    node_listeners = list(wiring.node_events)
    assert node_listeners[3] is wiring.managers.jobs.node_listener
    assert node_listeners[8] is wiring.managers.actors.node_listener
    assert _names(wiring.job_events) == [
        "VirtualClusterManager",
        "PlacementGroupScheduler",
        "TaskFailureMarker",
        "RuntimeEnvPins",
        "_JobListener",
    ]
    assert _names(wiring.pg_events) == ["VirtualClusterManager", "PlacementGroupScheduler"]
    assert _names(wiring.worker_events) == ["TaskFailureMarker", "_WorkerListener"]


def test_components_load_in_dependency_order() -> None:
    names = [c.name for c in _build(_NoIo()).components]
    assert names[0] == "store"
    for before, after in [
        ("cluster_identity", "nodes"),
        ("nodes", "jobs"),  # jobs of dead drivers' nodes finish at load
        ("nodes", "virtual_clusters"),  # replays the node table
        ("placement_groups", "virtual_clusters"),
        ("nodes", "actors"),
        ("actors", "gc"),  # the GC freezes what every load built
        ("gc", "rpc"),
        ("rpc", "restart_notice"),
        ("rpc", "head_children"),  # closed before the port: they unregister while served
    ]:
        assert names.index(before) < names.index(after), (before, after)


async def test_every_emitter_tells_the_listeners_the_wiring_subscribed() -> None:
    """The emitters were given the very fan-outs the wiring subscribed: a worker death
    reported to the worker manager reaches the task-failure marker and the actors (a
    fan-out with no listener yet must not be swapped for a fresh one)."""
    store = MemoryStore()
    await store.open()
    wiring = _build(store)
    supervisor = Supervisor(wiring.components)
    await supervisor.load()
    try:
        heard: list[bytes] = []

        class Ear:
            def on_worker_dead(self, failure: gcs_pb2.WorkerTableData) -> None:
                heard.append(failure.worker_address.worker_id)

        wiring.worker_events.subscribe(Ear())
        failure = gcs_pb2.WorkerTableData(is_alive=False)
        failure.worker_address.worker_id = b"\x05" * 28
        await wiring.managers.workers.report_failure(failure)
        assert heard == [b"\x05" * 28]
        marker = next(
            listener
            for listener in wiring.worker_events
            if type(listener).__name__ == "TaskFailureMarker"
        )
        assert marker.pending == 1  # the marker heard it first, as subscribed
    finally:
        await supervisor.close()


async def test_a_loaded_gcs_serves_nothing_and_reaches_no_raylet() -> None:
    """load() reads the store and builds state; binding the port and contacting raylets is
    run()'s (the shape a hot standby needs: loaded, following the store, not serving)."""
    store = MemoryStore()
    await store.open()
    node = gcs_pb2.GcsNodeInfo(
        node_id=b"\x07" * 28,
        node_manager_address="127.0.0.1",
        node_manager_port=1,
        state=gcs_pb2.GcsNodeInfo.ALIVE,
    )
    await store.write(WriteBatch().put(TABLE_NODE, node.node_id, node.SerializeToString()))
    raylets = FakeRayletGateway()
    wiring = _build(store, raylets)
    supervisor = Supervisor(wiring.components)
    await supervisor.load()
    try:
        assert node.node_id in wiring.managers.nodes.alive
        assert wiring.identity.loaded
        assert wiring.rpc.port == 0 and not wiring.rpc.is_serving
        assert raylets.calls == []
    finally:
        await supervisor.close()


async def test_a_failing_component_stops_the_gcs_and_wait_raises_its_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_tick(self: HealthChecker) -> int:
        raise RuntimeError("health loop broke")

    monkeypatch.setattr(HealthChecker, "tick", broken_tick)
    server = GcsServer(fast_config(), store=MemoryStore())
    await server.start()
    with pytest.raises(RuntimeError, match="health loop broke"):
        await server.wait()
    with pytest.raises(ConnectionRefusedError):  # every component closed: nothing serves
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
    await server.stop()  # idempotent after the failure


def test_the_wiring_reads_as_small_named_builders() -> None:
    """``build`` is a table of contents: no function of the wiring modules over 80 lines,
    wiring.py itself under 500 (it was one 383-line function)."""
    import ast
    import pathlib

    server = pathlib.Path(__file__).resolve().parents[2] / "gcs" / "server"
    assert len((server / "wiring.py").read_text().splitlines()) <= 500
    for path in sorted(server.glob("wiring*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                assert length <= 80, (path.name, node.name, length)
