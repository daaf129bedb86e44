"""Ray's periodic "Event stats" log block (``event_stats_print_interval_ms``): Ray's
``test_logging.py::test_periodic_event_stats`` waits for it in ``gcs_server.out``; ours logged
nothing of the kind."""

from __future__ import annotations

import asyncio
import pathlib
import threading

import pytest

from gcs.base.clock import FakeClock
from gcs.config import load_config
from gcs.proto import gcs_service_pb2 as pb
from gcs.server.event_stats import HandlerStats, print_periodically, ray_event_name
from tests.dropin.test_gcs_server_process import KNOBS, _call, serving_gcs_server
from tests.dropin.test_ray_config import dropin_config

KV_GET = "/ray.rpc.InternalKVGcsService/InternalKVGet"


def test_handlers_are_named_as_ray_names_them() -> None:
    assert ray_event_name(KV_GET) == "InternalKVGcsService.grpc_server.InternalKVGet"
    assert ray_event_name("/grpc.health.v1.Health/Check") == "Health.grpc_server.Check"
    assert ray_event_name("odd") == "odd"


def test_the_report_is_rays_layout_busiest_first() -> None:
    stats = HandlerStats()
    for seconds in (0.001, 0.003):
        stats.on_call(KV_GET, "OK", seconds)
    stats.on_call("/ray.rpc.NodeInfoGcsService/GetAllNodeInfo", "OK", 0.010)
    assert stats.report() == (
        "Main service Event stats:\n"
        "\n"
        "\n"
        "Global stats: 3 total\n"
        "Execution time:  mean = 4.67ms, total = 14.00ms\n"
        "Event stats:\n"
        "\tInternalKVGcsService.grpc_server.InternalKVGet - 2 total, Execution time: "
        "mean = 2.00ms, total = 4.00ms\n"
        "\tNodeInfoGcsService.grpc_server.GetAllNodeInfo - 1 total, Execution time: "
        "mean = 10.00ms, total = 10.00ms\n\n"
    )
    assert "Global stats: 0 total" in HandlerStats().report()


async def test_printed_every_interval_of_the_clock() -> None:
    clock, printed = FakeClock(), []
    task = asyncio.ensure_future(print_periodically(HandlerStats(), clock, 500, printed.append))
    await clock.advance_until(lambda: clock.sleepers == 1, step_s=0)  # asleep on the clock
    await clock.run_for(0.4, step_s=0.1)
    assert printed == []
    await clock.run_for(0.2, step_s=0.1)
    assert len(printed) == 1  # at 0.5 s of the clock
    await clock.run_for(0.6, step_s=0.1)
    assert len(printed) == 2  # and at 1.0 s
    task.cancel()


@pytest.mark.parametrize("interval_ms", [0, -1])
async def test_a_period_of_zero_or_less_is_off(interval_ms: int) -> None:
    printed: list[str] = []
    await asyncio.wait_for(
        print_periodically(HandlerStats(), FakeClock(), interval_ms, printed.append), 5
    )
    assert printed == []


def test_rays_knobs_from_the_config_list_and_environment() -> None:
    config = dropin_config({"event_stats_print_interval_ms": -1, "event_stats": False})
    assert (config.event_stats_print_interval_ms, config.event_stats) == (-1, False)
    env = {"RAY_event_stats_print_interval_ms": "100", "RAY_event_stats": "0"}
    config = load_config(env=env)
    assert (config.event_stats_print_interval_ms, config.event_stats) == (100, False)
    assert load_config(env={}).event_stats_print_interval_ms == 60_000  # Ray's default


def test_gcs_server_logs_the_block_to_its_stdout(tmp_path: pathlib.Path) -> None:
    """As Ray's fixture asks (``event_stats_print_interval_ms: 100``): the block, naming a
    handler that was called, appears in what Ray redirects to ``gcs_server.out``."""
    session = tmp_path / "session"
    knobs = {**KNOBS, "event_stats_print_interval_ms": 100, "event_stats": True}
    with serving_gcs_server(session, knobs) as proc:
        assert proc.stdout is not None
        port = int((session / f"gcs_server_port_{'cd' * 28}").read_text())
        _call(port, "InternalKVGet", pb.InternalKVGetRequest(namespace=b"x", key=b"k"))
        seen_block = False
        # a block every 0.1 s: 60 s without one only bounds a hang (the loop ends on kill)
        hang = threading.Timer(60, proc.kill)
        hang.start()
        try:
            for line in proc.stdout:
                seen_block = seen_block or "Main service Event stats:" in line
                if seen_block and "InternalKVGcsService.grpc_server.InternalKVGet - " in line:
                    break
            else:
                pytest.fail(f"gcs-server exited {proc.wait()} without the event stats")
        finally:
            hang.cancel()
