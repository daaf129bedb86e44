"""End to end on one machine: the GCS, the embedded-style autoscaler runtime with the
local provider (real ``gcs raylet`` processes) and ``gcs submit`` load.

16 x {CPU: 2} on 4-CPU workers with min_workers 1 -> 8 workers run, the work finishes,
idle workers drain and terminate back to 1.  The autoscaler's rounds run on a clock the
test moves; raylets registering and dying are events the GCS publishes.  Real processes
keep two waits on wall time, each with its reason.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.runtime import AutoscalerRuntime
from gcs.policy.autoscaling.model import InstanceStatus as S
from gcs.policy.autoscaling.model import NodeKind
from gcs.proto import autoscaler_pb2
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.autoscaler.clock import SteppedClock
from tests.autoscaler.driving import NodeWatch, Rounds
from tests.conftest import eventually, fast_config

pytestmark = pytest.mark.slow

CLUSTER = {
    "cluster_name": "e2e",
    "max_workers": 10,
    "upscaling_speed": 100,
    "provider": {"type": "local"},
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {"CPU": 0}, "max_workers": 0},
        "cpu4": {
            "resources": {"CPU": 4},
            "min_workers": 1,
            "max_workers": 10,
            "idle_timeout_s": 2,
        },
    },
}


def _workers(rt: AutoscalerRuntime, statuses: set[S]) -> list[str]:
    return [
        i.instance_id
        for i in rt.instances.instances.values()
        if i.node_kind is NodeKind.WORKER and i.status in statuses
    ]


async def test_scale_up_under_submit_and_back_down_to_min(tmp_path: Path) -> None:
    server = GcsServer(fast_config(), store=MemoryStore())
    await server.start()
    clock = SteppedClock()
    rt = AutoscalerRuntime(
        parse_cluster_config(CLUSTER),
        server.address,
        state_dir=tmp_path / "provider",
        store=server.store,
        clock=clock,
        interval_s=1.0,
    )
    rounds = Rounds(rt, clock)
    nodes = await NodeWatch(server.address).start()
    submit = None

    def running() -> int:
        return len(_workers(rt, {S.RAY_RUNNING}))

    try:
        await rounds.first()  # the provider brings up the head, then min_workers: 1
        await rounds.until(lambda: running() == 1, nodes=nodes)
        submit = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gcs", "submit", "--address", server.address,
            "--resources", '{"CPU": 2}', "--count", "16", "--seconds", "6",
            "--timeout", "240", "--format", "json",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip

        async def demand_shown() -> bool:
            state = await rt.gcs.get_cluster_resource_state()
            return sum(r.count for r in state.pending_resource_requests) > 0

        # wall clock: a real process (gcs submit) must start and queue its leases
        await eventually(demand_shown, timeout_s=120)
        await rounds.until(lambda: running() == 8, nodes=nodes)
        out, _ = await asyncio.wait_for(submit.communicate(), timeout=240)
        assert submit.returncode == 0
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["granted"] == 16 and result["infeasible"] == 0
        # queued leases moved to the workers the autoscaler added: the work spread out
        assert result["moved"] > 0 and len(result["ran_on"]) > 1, result

        async def all_idle_past_the_timeout() -> bool:
            state = await rt.gcs.get_cluster_resource_state()
            workers = [ns for ns in state.node_states if ns.ray_node_type_name == "cpu4"]
            return len(workers) == 8 and all(
                ns.status == autoscaler_pb2.IDLE and ns.idle_duration_ms > 2000 for ns in workers
            )

        # wall clock: the raylets measure their idle time on their own (real) clocks
        await eventually(all_idle_past_the_timeout, timeout_s=120)

        async def back_to_min() -> bool:
            return (
                running() == 1
                and len(nodes.alive) == 2
                and len(await rt.provider.get_non_terminated()) == 2  # nothing leaked
            )

        # idle workers drain and terminate back to min_workers; their deaths are events
        await rounds.until(back_to_min, nodes=nodes)
        assert len(server.managers.nodes.alive) == 2  # type: ignore[union-attr]
        events = rt.events.recent(100)
        kinds = [e.kind for e in events]
        # exactly the 7 surplus workers drained, and none relaunched: a round that still
        # sees the last round's drains as idle (the raylets report draining a little later)
        # counts them as leaving, not toward min_workers
        drained = {e.message.split()[2] for e in events if e.kind == "drain"}
        assert len(drained) == 7 and "launch" in kinds, [e.message for e in events]
        first_drain = kinds.index("drain")
        assert "launch" not in kinds[first_drain:], [e.message for e in events]
        assert rt.reconciler.failed_rounds == 0, rt.reconciler.last_error
        await rounds.round()  # publishes what the last round's drains logged
        # the events reach `gcs status` through the GCS (InternalKV), as `ray status` shows
        from gcs.cli.status import render_events
        from gcs.sdk import get_autoscaler_events

        got = await asyncio.to_thread(get_autoscaler_events, server.address)
        assert sum(1 for e in got if str(e["message"]).startswith("Draining")) == 7
        text = render_events(got)
        assert text.startswith("Recent autoscaler events:") and "Adding" in text
    finally:
        if submit is not None and submit.returncode is None:
            submit.kill()
            await submit.wait()
        await nodes.close()
        await rt.shutdown_cluster()
        await rt.close()
        await server.stop()
