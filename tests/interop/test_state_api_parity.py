"""``ray list jobs/tasks/actors`` and ``ray job status`` on our GCS equal stock Ray's.

The same driver and the same submitted job run on two one-node clusters side by side:
stock Ray 2.60 (``ray start --head`` with its own gcs_server and dashboard, on 127.0.0.7)
and ours (``gcs serve --head --dashboard --head-raylet``, on 127.0.0.2).  Ray's own CLI
lists both through their dashboards; the outputs are compared after normalizing what
differs by nature (ids, pids, addresses, times).  Every port is chosen free; every process
is stopped by group at the end.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import textwrap
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gcs.testing.ports import free_port
from tests.interop import venvs
from tests.interop.ray_processes import NO_LOG_MONITOR
from tests.interop.real_cluster import RealCluster, real_cluster
from tests.interop.state_api import list_state
from tests.interop.stock_ray import starting, stock_cluster

pytestmark = [pytest.mark.interop, pytest.mark.slow]

STOCK_HOST = "127.0.0.7"  # no other module uses it (127.0.0.4 hosts a worker elsewhere)
CLI_TIMEOUT_S = 180.0
SUBMISSION_ID = "parity-job-1"

DRIVER = textwrap.dedent(
    """
    import json, sys, ray

    ray.init(address=sys.argv[1], namespace="parity", logging_level="ERROR")

    @ray.remote(num_cpus=1)
    def square(x):
        return x * x

    @ray.remote(num_cpus=1, max_retries=0)
    def boom():
        raise ValueError("boom")

    @ray.remote(num_cpus=0)
    class Keeper:
        def ping(self):
            return "pong"

    keeper = Keeper.options(name="keeper", lifetime="detached").remote()
    squares = ray.get([square.remote(i) for i in range(3)], timeout=300)
    pong = ray.get(keeper.ping.remote(), timeout=300)
    doomed = Keeper.options(name="doomed").remote()
    ray.get(doomed.ping.remote(), timeout=300)
    ray.kill(doomed)
    try:
        ray.get(boom.remote(), timeout=300)
    except ray.exceptions.RayTaskError:
        pass
    print(json.dumps({"squares": squares, "pong": pong}))
    """
)

JOB = "import ray; ray.init(); print('sum', ray.get(ray.remote(lambda: 1 + 1).remote()))"

DROPPED = re.compile(r"(^|_)(time|time_ms|time_s|pid|ip|node_ip|ip_address|port)$")
"""Fields that differ by nature between two clusters (times, processes, addresses)."""
HEX_ID = re.compile(r"^(?:[0-9a-f]{8}|[0-9a-f]{32}|[0-9a-f]{36}|[0-9a-f]{48}|[0-9a-f]{56})$")


def normalize(value: Any, ids: dict[str, str] | None) -> Any:
    """Ids become ``<idLEN:N>`` in order of first sight (``ids`` None: ``<id>``), fields
    that differ by nature are dropped, addresses (dashboard URLs too) are blanked."""
    if isinstance(value, dict):
        return {k: normalize(v, ids) for k, v in sorted(value.items()) if not DROPPED.search(k)}
    if isinstance(value, list):
        return [normalize(v, ids) for v in value]
    if isinstance(value, str):
        if HEX_ID.match(value):
            return "<id>" if ids is None else ids.setdefault(value, f"<id{len(value)}:{len(ids)}>")
        return blank_addresses(value)
    return value


def blank_addresses(text: str) -> str:
    return re.sub(r"\d+\.\d+\.\d+\.\d+(:\d+)?", "<addr>", text)


def normalized_rows(rows: list[dict[str, Any]]) -> list[Any]:
    """Rows sorted by what they say (ids aside), then ids numbered in that order."""
    keyed = sorted(rows, key=lambda r: json.dumps(normalize(r, None), sort_keys=True))
    ids: dict[str, str] = {}
    return [normalize(r, ids) for r in keyed]


@contextlib.contextmanager
def stock_side(ray_default_venv: venvs.Venv) -> Iterator[RealCluster]:
    """Stock Ray 2.60: ``ray start --head --block`` with its dashboard (our helpers, none
    of our GCS: the head is Ray's own gcs_server)."""
    with stock_cluster(ray_default_venv, head_args=("--num-cpus=1",), host=STOCK_HOST) as c:
        yield c


@contextlib.contextmanager
def our_side(ray_default_venv: venvs.Venv) -> Iterator[RealCluster]:
    port = free_port()
    args = (
        "--dashboard", "--dashboard-port", str(port), "--ray-python", str(ray_default_venv.python),
        "--head-raylet", "--head-raylet-args",
        f"--num-cpus=1 --dashboard-agent-listen-port={free_port()} {NO_LOG_MONITOR}",
    )  # fmt: skip
    with real_cluster(ray_default_venv, gcs_args=args) as c:
        c.wait(lambda: c.synced_raylets() >= 1, 240, "the head raylet synced")
        c.dashboard = f"http://{c.gcs_host}:{port}"
        c.wait(lambda: _http_ok(f"{c.dashboard}/api/version"), 240, "the dashboard")
        yield c


@pytest.fixture(scope="module")
def sides(ray_default_venv: venvs.Venv) -> Iterator[tuple[RealCluster, RealCluster]]:
    """Stock's cluster and ours, started side by side (in a row, the two starts were this
    module's longest step); both stopped at the end."""
    with starting(stock_side(ray_default_venv)) as stock, our_side(ray_default_venv) as ours:
        yield stock.result(), ours


@pytest.fixture(scope="module")
def stock(sides: tuple[RealCluster, RealCluster]) -> RealCluster:
    return sides[0]


@pytest.fixture(scope="module")
def ours(sides: tuple[RealCluster, RealCluster]) -> RealCluster:
    return sides[1]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return json.loads(reply.read())


def ray_cli(c: RealCluster, *args: str) -> str:
    env = {**c.env, "RAY_ADDRESS": c.dashboard}
    done = c.run([str(c.ray_bin), *args], timeout=CLI_TIMEOUT_S, env=env)
    assert done.returncode == 0, f"ray {args}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def ray_list(c: RealCluster, what: str) -> list[dict[str, Any]]:
    out = ray_cli(c, "list", what, "--format", "json", "--limit", "1000")
    if out.strip() == "No resource in the cluster":
        return []
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def run_workload(c: RealCluster) -> None:
    assert c.driver(DRIVER) == {"squares": [0, 1, 4], "pong": "pong"}
    out = ray_cli(
        c, "job", "submit", "--submission-id", SUBMISSION_ID, "--", str(c.python), "-c", JOB
    )  # fmt: skip
    assert "sum 2" in out, out

    def settled() -> bool:  # every task's last state reported
        # the state API `ray list tasks` calls; the tests compare what `ray list` shows
        tasks = list_state(c.dashboard, "tasks")
        return len(tasks) >= 6 and all(t["state"] in ("FINISHED", "FAILED") for t in tasks)

    c.wait(settled, 180, "every task FINISHED or FAILED in the state API")


@pytest.fixture(scope="module")
def both(stock: RealCluster, ours: RealCluster) -> tuple[RealCluster, RealCluster]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # subprocesses and HTTP calls
        for done in [pool.submit(run_workload, c) for c in (stock, ours)]:
            done.result()
    return stock, ours


@pytest.mark.parametrize("what", ["jobs", "tasks", "actors"])
def test_ray_list_equals_stock_rays(both: tuple[RealCluster, RealCluster], what: str) -> None:
    stock, ours = both
    want = normalized_rows(ray_list(stock, what))
    got = normalized_rows(ray_list(ours, what))
    assert got == want, f"ours:\n{json.dumps(got, indent=1)}\nstock:\n{json.dumps(want, indent=1)}"


def test_ray_job_status_and_the_jobs_api_equal_stock_rays(
    both: tuple[RealCluster, RealCluster],
) -> None:
    """``ray job status <submission id>`` and the dashboard's job record (which finds the
    job's driver through GetAllJobInfo by submission id)."""
    stock, ours = both
    texts = []
    for c in (stock, ours):
        out = ray_cli(c, "job", "status", SUBMISSION_ID)
        out = re.sub(r"^\S+ \S+\s+\w+ \S+:\d+ -- ", "", out, flags=re.MULTILINE)
        texts.append(blank_addresses(out))
    assert texts[1] == texts[0]
    records = [_http_json(f"{c.dashboard}/api/jobs/{SUBMISSION_ID}") for c in (stock, ours)]
    assert records[0]["job_id"] and records[0]["driver_info"], records[0]
    want, got = normalized_rows([records[0]]), normalized_rows([records[1]])
    assert got == want, f"ours: {got}\nstock: {want}"


DRAIN_WITH_NEGATIVE_DEADLINE = textwrap.dedent(
    """
    import json, sys
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    client = GcsClient(address=sys.argv[1])
    try:
        client.drain_node("07" * 28, autoscaler_pb2.DRAIN_NODE_REASON_PREEMPTION, "x", -1)
        print(json.dumps({"raised": None}))
    except Exception as err:
        print(json.dumps({"raised": type(err).__name__, "message": str(err)}))
    """
)


def test_rays_client_gets_the_same_exception_for_a_refused_drain(
    stock: RealCluster, ours: RealCluster
) -> None:
    """Ray 2.60's GcsClient rebuilds the Ray status from ABORTED "<code name>" and the
    binary error details: the same exception and message on both (it was a bare OSError
    with no message on ours)."""
    want = stock.driver(DRAIN_WITH_NEGATIVE_DEADLINE)
    got = ours.driver(DRAIN_WITH_NEGATIVE_DEADLINE)
    assert "Draining deadline must be non-negative, received -1" in want["message"], want
    assert got == want


TASK_EVENTS_UNDER_A_LIMIT = textwrap.dedent(
    """
    import json, sys
    import grpc
    from ray.core.generated import gcs_service_pb2 as S, gcs_service_pb2_grpc as G

    stub = G.TaskInfoGcsServiceStub(grpc.insecure_channel(sys.argv[1]))
    every = stub.GetTaskEvents(S.GetTaskEventsRequest(), timeout=60)
    cut = stub.GetTaskEvents(S.GetTaskEventsRequest(limit=3), timeout=60)
    states = [max(e.state_updates.state_ts_ns) for e in cut.events_by_task]
    print(json.dumps({
        "stored": len(every.events_by_task),
        "returned": len(cut.events_by_task),
        "truncated": cut.num_truncated,
        "status_dropped": cut.num_status_task_events_dropped,
        "total_stored": cut.num_total_stored,
        "all_returned_finished_or_failed": all(s in (11, 12) for s in states),
    }))
    """
)


def test_a_limit_on_task_events_is_reported_as_rays(both: tuple[RealCluster, RealCluster]) -> None:
    """What the state API's "truncated" warning reads: Ray keeps the newest finished
    attempts first and counts what the limit cut as dropped (ours kept the oldest and
    counted nothing, so the state API never said the list was incomplete)."""
    stock, ours = both
    want = stock.driver(TASK_EVENTS_UNDER_A_LIMIT)
    got = ours.driver(TASK_EVENTS_UNDER_A_LIMIT)
    assert want["stored"] > 3 and want["status_dropped"] == want["stored"] - 3, want
    assert got == want
