"""Stock Ray 2.60 (its own GCS under ``ray start --head``) beside our GCS, for tests that
compare what a user sees on both.

The head binds another loopback address (:data:`STOCK_HEAD_HOST`), every port it opens is
chosen free (GCS, dashboard, agents, metrics, Ray client, node and object managers, worker
ports), it gets its own temp dir and the private HOME/TMPDIR of :func:`ray_env`, and the
``ray start --block`` process groups are killed at the end (``ray stop`` would not find
nodes under private temp dirs).  The value is a :class:`RealCluster` without our GCS, so
drivers, CLI calls and waits read the same as on our side.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import pathlib
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Collection, Iterator, Mapping, Sequence

from gcs.testing.ports import free_ports
from tests.interop import venvs
from tests.interop.ray_processes import NO_LOG_MONITOR
from tests.interop.real_cluster import START_TIMEOUT_S, RealCluster, Worker, kill_group

STOCK_HEAD_HOST = "127.0.0.4"
WORKER_PORTS = 24
"""Ports for a node's worker processes (``--worker-port-list``), instead of Ray's default
range 10002-19999 that other clusters on this machine use too."""


def node_ports(taken: Collection[int] = ()) -> tuple[str, ...]:
    """``ray start`` arguments giving every port a node opens a free one, all distinct and
    none of ``taken`` (Ray refuses a node whose components share a port)."""
    count = 6 + WORKER_PORTS
    ports = [p for p in free_ports(count + len(taken)) if p not in taken][:count]
    http, agent_grpc, runtime_env, metrics, node_manager, object_manager, *workers = ports
    return (
        f"--dashboard-agent-listen-port={http}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--metrics-export-port={metrics}",
        f"--node-manager-port={node_manager}",
        f"--object-manager-port={object_manager}",
        f"--worker-port-list={','.join(map(str, workers))}",
    )


def _dashboard_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/version", timeout=5) as reply:
            return bool(json.loads(reply.read()).get("ray_version"))
    except (OSError, ValueError):
        return False


HEAD_ATTEMPTS = 2
STARTUP_TIMED_OUT = "The current node timed out during startup"
"""Ray's ``ray start`` gives its raylet a fixed 30 s to register (``node.py``), which a
loaded 2-core machine can exceed; stock Ray is the baseline here, not what is tested, so
a node (head or worker) that gave up that way is started once more on fresh ports."""


def _start_head(
    ray_venv: venvs.Venv,
    tmp: pathlib.Path,
    taken: Sequence[int],
    host: str,
    head_args: Sequence[str],
    env: Mapping[str, str] | None,
) -> RealCluster:
    gcs_port, dashboard_port, client_port = taken
    cluster = RealCluster(ray_venv=ray_venv, tmp=tmp, port=gcs_port, storage="", gcs_host=host)
    cluster.dashboard = f"http://{host}:{dashboard_port}"
    cluster.env.update(env or {})
    temp_dir = pathlib.Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    cluster.temp_dirs.append(temp_dir)
    cluster.spawn(
        [
            str(cluster.ray_bin), "start", "--head", "--block",
            f"--node-ip-address={host}", f"--port={gcs_port}",
            "--include-dashboard=true", f"--dashboard-host={host}",
            f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={client_port}",
            f"--temp-dir={temp_dir}", "--disable-usage-stats", NO_LOG_MONITOR,
            *node_ports(taken), *head_args,
        ],
        name="stock-head",
    )  # fmt: skip
    return cluster


def _node_failure(cluster: RealCluster, node: subprocess.Popen[bytes], alive: int) -> str | None:
    """None once ``alive`` nodes are alive in stock's GCS; else why not (with the logs):
    ``node``, the ``ray start`` just started, exited or the wait ran out."""

    def up() -> bool:
        if node.poll() is not None:
            raise AssertionError(f"a stock `ray start` exited\n{cluster.logs()}")
        return len(cluster.alive_nodes()) >= alive

    try:
        cluster.wait(up, START_TIMEOUT_S, f"{alive} stock Ray node(s) alive")
    except AssertionError as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def stock_cluster(
    ray_venv: venvs.Venv,
    *,
    head_args: Sequence[str] = (),
    workers: Sequence[Worker] = (),
    host: str = STOCK_HEAD_HOST,
    env: Mapping[str, str] | None = None,
) -> Iterator[RealCluster]:
    """``ray start --head --block`` with its dashboard on ``host`` plus ``workers``, every
    node alive in stock's GCS and the dashboard answering; everything stopped at the end.
    ``cluster.dashboard`` is the dashboard's URL; ``env`` adds to every process's
    environment (Ray's ``RAY_...`` settings)."""
    for attempt in range(1, HEAD_ATTEMPTS + 1):
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="rays", dir="/tmp"))
        taken = free_ports(3)
        cluster = _start_head(ray_venv, tmp, taken, host, head_args, env)
        failure = _node_failure(cluster, cluster.others[0], alive=1)
        if failure is None:
            break
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if attempt == HEAD_ATTEMPTS or STARTUP_TIMED_OUT not in failure:
            raise AssertionError(failure)
    try:
        for n, worker in enumerate(workers, start=2):
            for attempt in range(1, HEAD_ATTEMPTS + 1):
                # the ports of node_ports() last: they replace add_worker's agent port, drawn
                # apart from them (click keeps an option's last value)
                args = (*worker.args, *node_ports(taken))
                index = cluster.add_worker(dataclasses.replace(worker, args=args))
                failure = _node_failure(cluster, cluster.workers[index], alive=n)
                if failure is None:
                    break
                kill_group(cluster.workers[index], grace_s=0)
                cluster.killed.add(index)
                if attempt == HEAD_ATTEMPTS or STARTUP_TIMED_OUT not in failure:
                    raise AssertionError(failure)
        cluster.wait(lambda: _dashboard_up(cluster.dashboard), START_TIMEOUT_S, "its dashboard")
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)


class Starting:
    """A cluster's context manager entered in a thread, so the cluster starts beside other
    work (a start is mostly waiting for Ray's processes; the comparison modules start
    stock's cluster and ours, which in a row were their longest step).  :meth:`result`
    waits for it; :meth:`close` stops it (or waits for the start, then stops it)."""

    def __init__(self, cluster: contextlib.AbstractContextManager[RealCluster]) -> None:
        self._stack = contextlib.ExitStack()
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._started = self._pool.submit(self._stack.enter_context, cluster)

    def result(self) -> RealCluster:
        return self._started.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._stack.close()


@contextlib.contextmanager
def starting(cluster: contextlib.AbstractContextManager[RealCluster]) -> Iterator[Starting]:
    """:class:`Starting` for a ``with`` block: closed at its end."""
    handle = Starting(cluster)
    try:
        yield handle
    finally:
        handle.close()
