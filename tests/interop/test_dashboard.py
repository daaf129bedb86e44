"""Ray's dashboard, ``ray list`` and ``ray job`` on our GCS (unmodified ``ray[default]==2.60``).

One cluster for the module: ``gcs serve --head --dashboard --head-raylet`` on 127.0.0.2 (the
GCS runs Ray's dashboard head and a real head raylet, supervised) and one ``ray start``
worker on 127.0.0.3.  The state CLI (``ray list``) and the job CLI (``ray job``) talk to the
dashboard over HTTP as a user's would (``--address`` / ``RAY_ADDRESS``); every call has a
timeout, and every process (dashboard and head raylet included) is stopped at the end.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import re
import signal
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gcs.testing.ports import free_port
from tests.interop import dashboard_browser, venvs
from tests.interop import dashboard_facts as facts
from tests.interop.dashboard_browser import Browser, Page, headless_chromium
from tests.interop.ray_processes import NO_LOG_MONITOR
from tests.interop.real_cluster import GCS_HOST, RealCluster, Worker, kill_group, real_cluster
from tests.interop.state_api import list_state
from tests.interop.stock_ray import Starting, starting, stock_cluster

pytestmark = [pytest.mark.interop, pytest.mark.slow]

CLI_TIMEOUT_S = 180.0

DRIVER = textwrap.dedent(
    """
    import json, sys, ray

    ray.init(address=sys.argv[1], namespace="dash", logging_level="ERROR")

    @ray.remote(num_cpus=1)
    def square(x):
        return x * x

    @ray.remote(num_cpus=0)
    class Keeper:
        def ping(self):
            return "pong"

    keeper = Keeper.options(name="keeper", lifetime="detached").remote()
    squares = ray.get([square.remote(i) for i in range(4)], timeout=300)
    pong = ray.get(keeper.ping.remote(), timeout=300)
    print(json.dumps({"squares": squares, "pong": pong,
                      "node": ray.get_runtime_context().get_node_id()}))
    """
)

PAGES_DRIVER = textwrap.dedent(
    """
    import json, sys, ray

    ray.init(address=sys.argv[1], namespace="pages", logging_level="ERROR")

    @ray.remote(num_cpus=1)
    def cube(x):
        return x ** 3

    @ray.remote(num_cpus=0)
    class PageKeeper:
        def ping(self):
            return "pong"

    @ray.remote(num_cpus=0)
    class Counter:  # the driver's own: dead once the driver exits
        def get(self):
            return 1

    keeper = PageKeeper.options(name="page-keeper", lifetime="detached").remote()
    counter = Counter.remote()
    cubes = ray.get([cube.remote(i) for i in range(4)], timeout=300)
    pings = ray.get([keeper.ping.remote(), counter.get.remote()], timeout=300)
    print(json.dumps({"cubes": cubes, "pings": pings}))
    """
)
PAGES = ("overview", "cluster", "jobs", "actors")
SCREENSHOTS = "GCS_DASHBOARD_SCREENSHOTS"
"""A directory to save each page's screenshot in (docs/dashboard/), when set."""

GHOST_DRIVER = textwrap.dedent(
    """
    import sys, time, ray

    ray.init(address=sys.argv[1], logging_level="ERROR")

    @ray.remote(num_cpus=1)
    def sleeper():
        time.sleep(3600)

    ref = sleeper.remote()
    time.sleep(3600)  # killed by the test
    """
)

JOB_SCRIPT = textwrap.dedent(
    """
    import ray
    ray.init()

    @ray.remote
    def hello():
        import greeting  # from the job's working dir, uploaded through our internal KV
        return greeting.TEXT

    print("job says:", ray.get(hello.remote()))
    """
)


@pytest.fixture(scope="module")
def cluster(ray_default_venv: venvs.Venv) -> Iterator[RealCluster]:
    port = free_port()
    args = (
        "--dashboard", "--dashboard-port", str(port), "--ray-python", str(ray_default_venv.python),
        "--head-raylet", "--head-raylet-args",
        f"--num-cpus=1 --dashboard-agent-listen-port={free_port()} {NO_LOG_MONITOR}",
    )  # fmt: skip
    with real_cluster(ray_default_venv, gcs_args=args, storage="sqlite:///{tmp}/gcs.db") as c:
        c.add_worker(Worker("127.0.0.3"))  # while our GCS starts its head raylet
        c.wait_workers()
        c.wait(lambda: c.synced_raylets() >= 2, 240, "the head raylet and the worker synced")
        c.dashboard = f"http://{GCS_HOST}:{port}"
        c.wait(lambda: _http_ok(f"{c.dashboard}/api/version"), 240, "the dashboard")
        yield c
        children = [start["pid"] for start in child_starts(c)]
    # our GCS stopped its dashboard and head raylet, each with its whole process group
    left = [pid for pid in children if _group_alive(pid)]
    assert not left, f"process groups left running: {left}"


@pytest.fixture(scope="module")
def chromium() -> None:
    """Debian's chromium and chromedriver with Selenium (scripts/ensure_browser.sh), checked
    before any cluster starts: a skip naming the script, a failure under
    GCS_INTEROP_REQUIRED=1 (as a missing venv)."""
    reason = dashboard_browser.unavailable()
    if reason and os.environ.get("GCS_INTEROP_REQUIRED") == "1":
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def stock_starting(ray_default_venv: venvs.Venv) -> Iterator[Starting]:
    """Stock Ray beside the module's cluster, the same shape: a 1-CPU head and a 2-CPU worker
    (its autoscaler in v2 mode, as ours reports).  Started in a thread: the test that uses it
    asks for it before ``cluster``, so the two clusters start side by side."""
    cluster = stock_cluster(
        ray_default_venv,
        head_args=("--num-cpus=1",),
        workers=[Worker("127.0.0.5")],
        env={"RAY_enable_autoscaler_v2": "1"},
    )
    with starting(cluster) as handle:
        yield handle


@pytest.fixture
def stock(stock_starting: Starting) -> Iterator[RealCluster]:
    """The started stock cluster, stopped after the test (only one test compares)."""
    yield stock_starting.result()
    stock_starting.close()


def child_starts(
    c: RealCluster, name: str | None = None, event: str = "child.started"
) -> list[dict[str, Any]]:
    """The ``child.started`` (or ``event``) records of our GCS's current log (pid, restarts)."""
    out = []
    for line in (c.tmp / f"gcs{c.gcs_starts}.log").read_text().splitlines():
        if f'"{event}"' in line:
            record = json.loads(line)
            if name is None or record["child"] == name:
                out.append(record)
    return out


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies of an exited group are not running processes
    members = [p for p in pathlib.Path("/proc").iterdir() if p.name.isdigit()]
    for proc in members:
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def working_dir(c: RealCluster, name: str) -> pathlib.Path:
    wd = c.tmp / name
    wd.mkdir()
    (wd / "main.py").write_text(JOB_SCRIPT)
    (wd / "greeting.py").write_text('TEXT = "hello from a task"\n')
    return wd


def _http_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return str(reply.read().decode())
    except OSError:
        return ""


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def ray_cli(c: RealCluster, *args: str, use_env: bool = False) -> str:
    env = {**c.env, "RAY_ADDRESS": c.dashboard} if use_env else c.env
    address = [] if use_env else ["--address", c.dashboard]
    # `ray list nodes --address ...`, `ray job submit --address ... -- python x.py`
    argv = [str(c.ray_bin), *args[:2], *address, *args[2:]]
    done = c.run(argv, timeout=CLI_TIMEOUT_S, env=env)
    assert done.returncode == 0, f"ray {args}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def ray_list(c: RealCluster, what: str, *extra: str) -> list[dict[str, Any]]:
    out = ray_cli(c, "list", what, "--format", "json", "--limit", "1000", *extra, use_env=True)
    if out.strip() == "No resource in the cluster":
        return []
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def _http_json(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def _pages_workload(c: RealCluster) -> None:
    """A driver with tasks and actors (one detached), then a job through the job API (its
    REST calls, as `ray job submit` makes them, without a CLI to start)."""
    jobs = f"{c.dashboard}/api/jobs/"
    assert _http_json(jobs) == [], "the first workload of this cluster (see the test)"
    assert c.driver(PAGES_DRIVER)["cubes"] == [0, 1, 8, 27]
    _http_json(jobs, {"entrypoint": "python -c 'print(1)'", "submission_id": "pages-job"})
    done = ("SUCCEEDED", "FAILED", "STOPPED")
    c.wait(lambda: _http_json(f"{jobs}pages-job")["status"] in done, 180, "pages-job done")
    assert _http_json(f"{jobs}pages-job")["status"] == "SUCCEEDED"


READERS: dict[str, tuple[Callable[[Page, str], Any], Callable[[Any], bool]]] = {
    # each page's facts, and when it shows the whole workload (2 nodes, 2 jobs, 3 actors)
    "overview": (facts.overview_facts, lambda f: facts.overview_ready(f, nodes=2, jobs=2)),
    "cluster": (facts.cluster_facts, lambda f: facts.cluster_ready(f, nodes=2)),
    "jobs": (facts.jobs_facts, lambda f: facts.jobs_ready(f, jobs=2)),
    "actors": (facts.actors_facts, lambda f: facts.actors_ready(f, actors=3)),
}
SETTLE_S = 60.0
"""A page may catch either cluster between two states (a node going idle): the two are read
again until they agree; a difference that lasts this long is a real one."""


def _read_page(browser: Browser, c: RealCluster, page: str, shots: str) -> Any:
    read, ready = READERS[page]
    side = "ours" if c.gcs_host == GCS_HOST else "stock"
    url = f"{c.dashboard}/#/{page}"
    seen = browser.read(url, lambda p: read(p, c.gcs_host), ready, f"{side} {page}")
    if shots:
        browser.screenshot(pathlib.Path(shots) / f"{page}-{side}.png")
    return seen


@pytest.mark.timeout(600)  # both clusters start within it: the module's and stock's
def test_dashboard_pages_show_what_stock_rays_show(
    chromium: None, stock_starting: Starting, cluster: RealCluster, stock: RealCluster
) -> None:
    """The Overview, Cluster, Jobs and Actors pages of Ray's web UI, opened in headless
    Chromium on our GCS and on stock Ray after the same workload, show the same facts
    (dashboard_facts: ids, addresses, times and memory sizes made neutral).  The module's
    first test: the workload must be the first on its cluster."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # subprocesses and HTTP calls
        for done in [pool.submit(_pages_workload, c) for c in (cluster, stock)]:
            done.result()
    shots = os.environ.get(SCREENSHOTS, "")
    differ = {}
    with headless_chromium() as browser:
        for page in PAGES:
            deadline = time.monotonic() + SETTLE_S
            while True:
                ours, theirs = (_read_page(browser, c, page, shots) for c in (cluster, stock))
                if ours == theirs or time.monotonic() > deadline:
                    break
            if ours != theirs:
                differ[page] = f"{page}:\n ours  {ours}\n stock {theirs}"
    assert not differ, "\n".join(differ.values())


def test_ray_list_nodes_shows_the_head_raylet_and_the_worker(cluster: RealCluster) -> None:
    out = ray_cli(cluster, "list", "nodes", "--format", "json")
    rows = json.loads(out)
    ours = {n.node_id.hex(): n for n in cluster.alive_nodes()}
    assert {r["node_id"] for r in rows if r["state"] == "ALIVE"} == set(ours), rows
    heads = [r for r in rows if r["is_head_node"]]
    assert len(heads) == 1 and heads[0]["node_ip"] == GCS_HOST, rows


def test_ray_list_actors_tasks_workers_show_the_real_rows(cluster: RealCluster) -> None:
    out = cluster.driver(DRIVER)
    assert out["squares"] == [0, 1, 4, 9] and out["pong"] == "pong"

    actors = ray_list(cluster, "actors")
    keeper = [a for a in actors if a["name"] == "keeper"]
    assert keeper and keeper[0]["state"] == "ALIVE", actors
    assert keeper[0]["class_name"] == "Keeper"

    def squares_finished(tasks: list[dict[str, Any]]) -> bool:
        return len(tasks) == 4 and all(t["state"] == "FINISHED" for t in tasks)

    # waited for on the state API `ray list` calls (list_state), then seen with `ray list`
    square = ("name", "square")
    cluster.wait(
        lambda: squares_finished(list_state(cluster.dashboard, "tasks", square)),
        120,
        "4 FINISHED square tasks in the state API",
    )
    tasks = ray_list(cluster, "tasks", "--filter", "name=square")
    assert squares_finished(tasks), tasks
    workers = ray_list(cluster, "workers")
    assert any(w["worker_type"] == "DRIVER" for w in workers), workers
    assert any(w["worker_type"] == "WORKER" for w in workers), workers

    # Ray's dashboards read the GCS's figures from the head's agent (Ray's metrics path):
    # our GCS exported them there under Ray's names, the port learned from the head node
    (head,) = [n for n in cluster.alive_nodes() if n.is_head_node]
    page = f"http://{head.node_manager_address}:{head.metrics_export_port}/metrics"
    keeper_row = re.compile(
        r'^ray_actors\{(?=[^}]*Component="gcs_server")(?=[^}]*Name="Keeper")'
        r'(?=[^}]*Source="gcs")(?=[^}]*State="ALIVE")[^}]*\} 1\.0$',
        re.MULTILINE,
    )
    cluster.wait(
        lambda: bool(keeper_row.search(_http_text(page))),
        120,
        f"ray_actors{{Source=gcs,Name=Keeper,State=ALIVE}} on the head agent's {page}",
    )


def test_ray_job_submit_runs_a_script_to_succeeded_with_its_logs(
    cluster: RealCluster,
) -> None:
    """`ray job submit --working-dir`: the package goes to our internal KV, the job runs on
    the head raylet, a task imports from the working dir; status and logs come back."""
    out = ray_cli(
        cluster, "job", "submit", "--submission-id", "dash-job-1",
        "--working-dir", str(working_dir(cluster, "wd1")), "--", "python", "main.py",
    )  # fmt: skip
    assert "job says: hello from a task" in out, out
    status = ray_cli(cluster, "job", "status", "dash-job-1")
    assert "Job 'dash-job-1' succeeded" in status, status
    with urllib.request.urlopen(f"{cluster.dashboard}/api/jobs/dash-job-1", timeout=30) as r:
        job = json.loads(r.read())
    assert job["status"] == "SUCCEEDED", job
    head = [n.node_id.hex() for n in cluster.alive_nodes() if n.is_head_node]
    assert job["driver_node_id"] in head, f"the driver ran on the head raylet: {job}"
    logs = ray_cli(cluster, "job", "logs", "dash-job-1")
    assert "job says: hello from a task" in logs, logs


def test_a_killed_drivers_running_task_is_failed_not_a_running_ghost(
    cluster: RealCluster,
) -> None:
    """kill -9 of a driver whose task runs: the job finishes, its worker dies, and the task
    shows FAILED (WORKER_DIED) in `ray list tasks` instead of RUNNING forever."""
    driver = cluster.spawn(
        [str(cluster.python), "-c", GHOST_DRIVER, cluster.address], name="ghost-driver"
    )

    def sleeper_state() -> str:
        # the state API `ray list` calls (list_state): waited on, then seen with `ray list`
        rows = list_state(cluster.dashboard, "tasks", ("name", "sleeper"), detail=True)
        return str(rows[0]["state"]) if rows else ""

    def sleeper_rows() -> list[dict[str, Any]]:
        return ray_list(cluster, "tasks", "--filter", "name=sleeper", "--detail")

    cluster.wait(lambda: sleeper_state() == "RUNNING", 180, "the sleeper task RUNNING")
    [row] = sleeper_rows()
    assert row["state"] == "RUNNING", row  # it sleeps for an hour: RUNNING until the kill
    kill_group(driver, grace_s=0)
    cluster.wait(lambda: sleeper_state() == "FAILED", 180, "the sleeper task FAILED")
    [row] = sleeper_rows()
    assert row["state"] == "FAILED" and row["error_type"] == "WORKER_DIED", row


def test_the_dashboard_is_restarted_after_it_dies(cluster: RealCluster) -> None:
    [first] = child_starts(cluster, "dashboard")
    os.killpg(first["pid"], signal.SIGKILL)
    cluster.wait(lambda: len(child_starts(cluster, "dashboard")) == 2, 120, "a new dashboard")
    assert child_starts(cluster, "dashboard")[1]["restarts"] == 1
    cluster.wait(lambda: _http_ok(f"{cluster.dashboard}/api/version"), 120, "the dashboard back")
    rows = json.loads(ray_cli(cluster, "list", "nodes", "--format", "json"))
    assert len([r for r in rows if r["state"] == "ALIVE"]) == 2


def test_no_dashboard_or_agent_log_names_a_gcs_method_we_do_not_serve(
    cluster: RealCluster,
) -> None:
    logs = [*cluster.tmp.glob("head/session_*/logs/*"), *cluster.ray_logs()]
    offending = []
    for path in logs:
        if not path.is_file() or not path.name.startswith(("dashboard", "raylet", "gcs_")):
            continue
        text = path.read_text(errors="replace")
        for needle in ("UNIMPLEMENTED", "Method not found", "Unimplemented"):
            if needle in text:
                offending.append(f"{path.name}: {needle}")
    assert len(logs) > 5 and not offending, offending


def test_a_gcs_killed_and_restarted_adopts_its_head_raylet_and_restarts_the_dashboard(
    cluster: RealCluster,
) -> None:
    """kill -9 of our GCS (SQLite store): the dashboard dies with it, the head raylet lives
    on like every raylet; the restarted GCS adopts that raylet (no second head), starts a
    new dashboard, and `ray job submit` runs again."""
    [raylet] = child_starts(cluster, "head-raylet")[-1:]
    [dashboard] = child_starts(cluster, "dashboard")[-1:]
    cluster.kill_gcs()
    cluster.wait(lambda: not _group_alive(dashboard["pid"]), 60, "the dashboard gone with the GCS")
    assert _group_alive(raylet["pid"]), "the head raylet outlives the GCS"
    cluster.start_gcs()
    [adopted] = child_starts(cluster, "head-raylet", event="child.adopted")
    assert adopted["pid"] == raylet["pid"]
    cluster.wait(lambda: len(child_starts(cluster, "dashboard")) >= 1, 60, "a new dashboard")
    cluster.wait(lambda: _http_ok(f"{cluster.dashboard}/api/version"), 240, "the dashboard")
    cluster.wait(lambda: cluster.synced_raylets() >= 2, 240, "both raylets synced again")
    heads = [n for n in cluster.alive_nodes() if n.is_head_node]
    assert len(heads) == 1, heads
    out = ray_cli(
        cluster, "job", "submit", "--submission-id", "dash-job-2",
        "--working-dir", str(working_dir(cluster, "wd2")), "--", "python", "main.py",
    )  # fmt: skip
    assert "job says: hello from a task" in out, out


def test_ray_job_stop_stops_a_running_job(cluster: RealCluster) -> None:
    ray_cli(
        cluster, "job", "submit", "--submission-id", "dash-stop", "--no-wait",
        "--", "python", "-c", "import time; print('started', flush=True); time.sleep(3600)",
    )  # fmt: skip

    def status() -> str:
        url = f"{cluster.dashboard}/api/jobs/dash-stop"
        with urllib.request.urlopen(url, timeout=30) as reply:
            return str(json.loads(reply.read())["status"])

    cluster.wait(lambda: status() == "RUNNING", 180, "the job RUNNING")
    ray_cli(cluster, "job", "stop", "dash-stop")
    cluster.wait(lambda: status() == "STOPPED", 180, "the job STOPPED")
