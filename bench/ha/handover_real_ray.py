"""The pause a real Ray 2.60 driver sees across planned handovers (issue 29's must-show).

Two ``gcs serve --ha --head`` members on a private Redis, one ``ray start`` worker, and a
driver that calls ``_internal_kv_put`` in a loop through Ray's own C++ GCS client, writing the
monotonic time of every answer (and of every failure).  ``gcs ha handover`` is run
``--handovers`` times, alternating leaders; a handover's pause is the longest gap between two
successive answers that overlaps it (so it includes one call's own latency).  Prints each
pause, p50 / p99 / max, the calls and the failed ones, and the load average; the logs are
kept under ``--logs`` (a temporary directory by default, printed).

    python -m bench.ha.handover_real_ray --handovers 20
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import tempfile
import time

from gcs.testing.redis_server import RedisServer
from tests.interop import venvs
from tests.interop.ha_cluster import ha_ray_cluster, start_workers
from tests.interop.real_cluster import Worker
from tests.interop.restarts import WORKER_HOSTS

KV_DRIVER = """
import os, sys, time
import ray
from ray.experimental.internal_kv import _internal_kv_put
ray.init(address=sys.argv[1], namespace="handover-bench", logging_level="ERROR")
stop = sys.argv[2]
n = 0
with open(stop + ".times", "w") as out:
    print("progress 1", flush=True)
    while not os.path.exists(stop):
        n += 1
        try:
            _internal_kv_put(b"k", str(n).encode(), overwrite=True)
            out.write(f"{time.monotonic():.6f}\\n")
        except Exception as err:
            out.write(f"F {time.monotonic():.6f} {err!r}"[:300] + "\\n")
        if n % 200 == 0:
            out.flush()
            print(f"progress {n}", flush=True)
"""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(handovers: int, logs: pathlib.Path) -> dict[str, object]:
    venv = venvs.require_venv(venvs.RAY)
    redis = RedisServer().start()
    try:
        workers = [Worker(WORKER_HOSTS[0])]
        with ha_ray_cluster(venv, redis.url, logs, workers) as ha:
            ha.start_member("a").wait_for("ha.leader")
            ha.start_member("b").wait_for("ha.standby")
            start_workers(ha, workers)
            c = ha.cluster
            stop = c.tmp / "stop"
            driver = c.spawn([str(c.python), "-c", KV_DRIVER, c.address, str(stop)], name="driver")
            c.wait(lambda: ha.progress() >= 400, 300, "the driver's first calls")
            spans: list[tuple[float, float, float]] = []
            leader, standby = "a", "b"
            for i in range(handovers):
                since = time.monotonic()
                took = float(ha.handover(leader).get("took_ms", 0.0))
                spans.append((since, time.monotonic(), took))
                want = ha.progress() + 400
                c.wait(lambda w=want: ha.progress() >= w, 300, "the driver's calls after it")
                ha.members[leader].wait_for("ha.standby", count=i // 2 + 2)
                leader, standby = standby, leader
                time.sleep(0.5)
            stop.touch()
            c.wait_exit(driver, 120, "the driver's end")
            lines = pathlib.Path(f"{stop}.times").read_text().splitlines()
    finally:
        redis.cleanup()
    answered = sorted(float(x) for x in lines if x and not x.startswith("F"))
    failed = [x for x in lines if x.startswith("F")]
    pauses = []
    for since, until, _ in spans:
        gaps = [b - a for a, b in itertools.pairwise(answered) if b >= since and a <= until]
        pauses.append(round(max(gaps, default=0.0) * 1000, 1))
    return {
        "handovers": handovers,
        "pauses_ms": pauses,
        "p50_ms": _pct(pauses, 0.5),
        "p99_ms": _pct(pauses, 0.99),
        "max_ms": max(pauses),
        "leader_part_p50_ms": _pct([took for *_, took in spans], 0.5),
        "calls": len(answered),
        "failed": len(failed),
        "first_failures": failed[:3],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handovers", type=int, default=20)
    parser.add_argument("--logs", type=pathlib.Path, default=None, help="where logs are kept")
    args = parser.parse_args()
    logs = args.logs or pathlib.Path(tempfile.mkdtemp(prefix="handover-real-ray-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}; logs kept in {logs}", flush=True)
    result = run(args.handovers, logs)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
