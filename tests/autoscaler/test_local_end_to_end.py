"""End to end on one machine: the GCS, the embedded-style autoscaler runtime with the
local provider (real ``gcs raylet`` processes) and ``gcs submit`` load.

16 x {CPU: 2} on 4-CPU workers with min_workers 1 -> 8 workers run, the work finishes,
idle workers drain and terminate back to 1.  Real processes, so real time: every wait is a
bounded poll, never a sleep that assumes a speed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.model import InstanceStatus as S
from gcs.autoscaler.model import NodeKind
from gcs.autoscaler.runtime import AutoscalerRuntime
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
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
    rt = AutoscalerRuntime(
        parse_cluster_config(CLUSTER),
        server.address,
        state_dir=tmp_path / "provider",
        store=server.store,
        interval_s=0.3,
    )
    submit = None
    try:
        await rt.start()
        # the provider brings up the head, then min_workers: 1
        await eventually(lambda: len(_workers(rt, {S.RAY_RUNNING})) == 1, timeout_s=120)
        submit = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gcs", "submit", "--address", server.address,
            "--resources", '{"CPU": 2}', "--count", "16", "--seconds", "6",
            "--timeout", "240",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await eventually(lambda: len(_workers(rt, {S.RAY_RUNNING})) == 8, timeout_s=180)
        out, _ = await asyncio.wait_for(submit.communicate(), timeout=240)
        assert submit.returncode == 0
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["granted"] == 16 and result["infeasible"] == 0
        # queued leases moved to the workers the autoscaler added: the work spread out
        assert result["moved"] > 0 and len(result["ran_on"]) > 1, result
        # idle workers drain and terminate back to min_workers
        await eventually(lambda: len(_workers(rt, {S.RAY_RUNNING})) == 1, timeout_s=180)
        await eventually(lambda: len(server.managers.nodes.alive) == 2, timeout_s=60)

        async def only_head_and_min_worker() -> bool:  # nothing leaked
            return len(await rt.provider.get_non_terminated()) == 2

        await eventually(only_head_and_min_worker, timeout_s=60)

        def drains() -> int:
            return [e.kind for e in rt.events.recent(100)].count("drain")

        # a drain is logged when DrainRaylet's reply is back: on a loaded machine the drained
        # node can be dead and its process gone before the stopper's task resumes
        await eventually(lambda: drains() >= 7, timeout_s=30)
        kinds = [e.kind for e in rt.events.recent(100)]
        assert kinds.count("drain") == 7 and "launch" in kinds
        assert rt.reconciler.failed_rounds == 0, rt.reconciler.last_error
        # the events reach `gcs status` through the GCS (InternalKV), as `ray status` shows
        from gcs.sdk import get_autoscaler_events
        from gcs.status import render_events

        async def published() -> bool:
            got = await asyncio.to_thread(get_autoscaler_events, server.address)
            return sum(1 for e in got if str(e["message"]).startswith("Draining")) == 7

        await eventually(published, timeout_s=30)
        text = render_events(await asyncio.to_thread(get_autoscaler_events, server.address))
        assert text.startswith("Recent autoscaler events:") and "Adding" in text
    finally:
        if submit is not None and submit.returncode is None:
            submit.kill()
            await submit.wait()
        await rt.shutdown_cluster()
        await rt.stop()
        await server.stop()
