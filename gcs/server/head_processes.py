"""Ray processes ``gcs serve --head`` runs beside itself: Ray's dashboard and a head raylet.

Both come from an unmodified Ray 2.60 install (``ray[default]``) in the interpreter named by
``ray_python`` (default: the one running the GCS).

* **Dashboard** (``--dashboard``): Ray's own dashboard head, ``ray/dashboard/dashboard.py``,
  with the arguments ``ray start --head`` passes it in 2.60
  (``ray._private.services.start_api_server``).  It serves the state API (``ray list``), the
  job API (``ray job``) and the web UI from our GCS's RPCs, and writes its logs to the head's
  session log dir (``<temp_dir>/<session_name>/logs/dashboard.log``), as on a Ray head.
* **Head raylet** (``--head-raylet``): ``ray start --address=<us> --block`` on the GCS host
  with the head's temp dir and the label :data:`HEAD_RAYLET_LABEL`; the GCS registers that
  raylet as the head node (``is_head_node``), so it replaces the virtual head record.  Ray's
  job API needs it: the dashboard's ``JobHead`` hands every submission to the *head node's*
  dashboard agent, whose job manager pins the ``JobSupervisor`` actor (and so the job's
  driver) to the head node by its ``ray.io/node-id`` label.  Without a head raylet, ``ray job
  submit`` waits for a head agent that does not exist.

Supervision: each child runs in its own process group, started once we serve, restarted
after it exits with an exponential backoff (reset once it ran for ``stable_s``), and stopped
by process group (SIGTERM, then SIGKILL after a grace period) when the GCS stops.  When
the GCS dies without stopping them (kill -9):

* the dashboard gets SIGTERM with it (Linux ``PR_SET_PDEATHSIG``): it is stateless, and the
  restarted GCS starts a fresh one on the same port;
* the head raylet lives on, as every raylet does through a GCS restart (its jobs' drivers
  keep running).  Its pid is kept in ``<session_dir>/logs/gcs_head_raylet.pid``; a GCS
  restarted on the same store (same session) *adopts* the process named there when it still
  runs the same command line, instead of starting a second head raylet, and watches it.

The backoff is a pure function; the supervisor takes its spawner, adopter and clock
injected (restart delays, the stop grace and an adopted process's polling run on the clock);
each child's supervision loop is a :class:`~gcs.base.background.Background` task the component
closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pathlib
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from gcs.base.background import Background
from gcs.base.clock import SYSTEM_CLOCK, Clock, within
from gcs.base.processes import pid_alive
from gcs.managers.head import HEAD_RAYLET_LABEL
from gcs.server.addresses import advertised_host

log = structlog.get_logger("gcs.head_processes")

DASHBOARD_LOG = "dashboard.log"
"""Written by the dashboard itself into the session log dir (Ray's name)."""


@dataclass(frozen=True, slots=True)
class ChildSpec:
    name: str
    argv: tuple[str, ...]
    log_path: str
    """Where the child's stdout and stderr go (appended)."""
    env: Mapping[str, str] | None = None
    pidfile: str = ""
    """Set: the child outlives a GCS that dies without stopping it, its pid is kept here, and
    a restarted GCS adopts it (see the module docstring).  Empty: it dies with the GCS."""


def restart_delay_s(failures: int, *, base_s: float = 1.0, cap_s: float = 60.0) -> float:
    """Delay before restarting a child that exited ``failures`` times in a row: 1, 2, 4, ...
    seconds, at most ``cap_s``."""
    if failures <= 0:
        return 0.0
    return min(cap_s, base_s * 2.0 ** min(failures - 1, 30))


def failures_after_exit(previous: int, ran_s: float, *, stable_s: float) -> int:
    """A child that ran ``stable_s`` or longer starts a new series of failures."""
    return 1 if ran_s >= stable_s else previous + 1


def session_dir(temp_dir: str, session_name: str) -> pathlib.Path:
    return pathlib.Path(temp_dir) / session_name


def dashboard_argv(
    python: str,
    *,
    host: str,
    port: int,
    gcs_address: str,
    cluster_id_hex: str,
    node_ip: str,
    temp_dir: str,
    session_dir: pathlib.Path,
) -> tuple[str, ...]:
    """Ray 2.60's dashboard head command line, as ``start_api_server`` builds it."""
    return (
        python, "-m", "ray.dashboard.dashboard",
        f"--host={host}",
        f"--port={port}",
        "--port-retries=0",
        f"--temp-dir={temp_dir}",
        f"--log-dir={session_dir / 'logs'}",
        f"--session-dir={session_dir}",
        f"--gcs-address={gcs_address}",
        f"--cluster-id-hex={cluster_id_hex}",
        f"--node-ip-address={node_ip}",
        "--proxy-server-url=",
    )  # fmt: skip


def head_raylet_argv(
    python: str,
    *,
    gcs_address: str,
    node_ip: str,
    temp_dir: str,
    extra_args: Sequence[str] = (),
) -> tuple[str, ...]:
    """``ray start --address=<us> --block`` as the head raylet (see the module docstring)."""
    return (
        python, "-m", "ray.scripts.scripts", "start",
        f"--address={gcs_address}",
        "--block",
        f"--node-ip-address={node_ip}",
        f"--temp-dir={temp_dir}",
        f"--labels={HEAD_RAYLET_LABEL}=true",
        *extra_args,
    )  # fmt: skip


class Process(Protocol):
    pid: int

    async def wait(self) -> int: ...


Spawn = Callable[[ChildSpec], Awaitable[Process]]


_FATE_SHARE = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0); "  # PDEATHSIG
    "os.getppid() == int(sys.argv[1]) or sys.exit(1); "  # the GCS died before the prctl
    "os.execvp(sys.argv[2], sys.argv[2:])"
)
"""Run by a fresh interpreter, never in a forked copy of the GCS (``preexec_fn`` is unsafe
with gRPC's threads: it crashed the child now and then).  ``PR_SET_PDEATHSIG`` survives
the exec into the real command."""


def _fate_shared(argv: Sequence[str]) -> tuple[str, ...]:
    """``argv`` started so that it gets SIGTERM when this process dies (Linux)."""
    if sys.platform != "linux":
        return tuple(argv)
    return (sys.executable, "-c", _FATE_SHARE, str(os.getpid()), *argv)


async def spawn_process(spec: ChildSpec) -> Process:
    """The child in a new session (its own process group), output appended to its log."""
    path = pathlib.Path(spec.log_path)
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    out = await asyncio.to_thread(path.open, "ab")
    try:
        argv = spec.argv if spec.pidfile else _fate_shared(spec.argv)
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(spec.env) if spec.env is not None else None,
            start_new_session=True,
        )
    finally:
        out.close()


class AdoptedProcess:
    """A child a previous GCS started (not ours to ``wait()`` on): polled until it is gone."""

    def __init__(self, pid: int, *, clock: Clock = SYSTEM_CLOCK, poll_s: float = 1.0) -> None:
        """``clock``: the fallback polling (no pidfd) sleeps on it."""
        self.pid = pid
        self._clock = clock
        self._poll_s = poll_s

    async def wait(self) -> int:
        """Until it exits: a pidfd turns readable then (Linux 5.3+), else polled."""
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            fd = -1
        if fd >= 0:
            loop = asyncio.get_running_loop()
            gone: asyncio.Future[None] = loop.create_future()

            def exited() -> None:
                if not gone.done():
                    gone.set_result(None)

            loop.add_reader(fd, exited)
            try:
                if pid_alive(self.pid):
                    await gone
            finally:
                loop.remove_reader(fd)
                os.close(fd)
            return -1  # its exit status went to its own parent
        for _ in itertools.count():
            if not pid_alive(self.pid):
                break
            await self._clock.sleep(self._poll_s)
        return -1


def _cmdline(pid: int) -> tuple[str, ...] | None:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0")[:-1])


async def adopt_survivor(spec: ChildSpec, clock: Clock) -> Process | None:
    """The process ``spec.pidfile`` names, if it still runs ``spec.argv``."""
    if not spec.pidfile:
        return None
    try:
        pid = int((await asyncio.to_thread(pathlib.Path(spec.pidfile).read_text)).strip())
    except (OSError, ValueError):
        return None
    if not pid_alive(pid) or _cmdline(pid) != tuple(spec.argv):
        return None
    return AdoptedProcess(pid, clock=clock)


async def record_pid(spec: ChildSpec, pid: int | None) -> None:
    """Keep (``pid``) or forget (None) the child's pid in ``spec.pidfile``."""
    if not spec.pidfile:
        return
    path = pathlib.Path(spec.pidfile)
    if pid is None:
        await asyncio.to_thread(path.unlink, missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    await asyncio.to_thread(tmp.write_text, f"{pid}\n")
    await asyncio.to_thread(os.replace, tmp, path)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class SupervisedChild:
    """One child kept running until :meth:`stop` (see the module docstring)."""

    def __init__(
        self,
        spec: ChildSpec,
        clock: Clock,
        *,
        spawn: Spawn = spawn_process,
        adopt: Callable[[ChildSpec, Clock], Awaitable[Process | None]] = adopt_survivor,
        record: Callable[[ChildSpec, int | None], Awaitable[None]] = record_pid,
        kill_group: Callable[[int, signal.Signals], None] = _signal_group,
        stable_s: float = 60.0,
        backoff_cap_s: float = 60.0,
    ) -> None:
        self.spec = spec
        self._spawn = spawn
        self._adopt = adopt
        self._record = record
        self._clock = clock
        self._kill_group = kill_group
        self._stable_s = stable_s
        self._backoff_cap_s = backoff_cap_s
        self._stopping = False
        self._tasks = Background(f"child-{spec.name}")
        self._task: asyncio.Task[None] | None = None
        self.process: Process | None = None
        self.starts = 0
        self.failures = 0
        self.adopted = False

    def start(self) -> None:
        """Supervise the child in a task of its own until :meth:`stop`."""
        self._task = self._tasks.start(self._run(), "supervise")

    def _now(self) -> float:
        return self._clock.monotonic_s()

    async def _run(self) -> None:
        survivor = await self._adopt(self.spec, self._clock)
        if survivor is not None:
            self.adopted = True
            log.info("child.adopted", child=self.spec.name, pid=survivor.pid)
        while not self._stopping:
            started = self._now()
            try:
                if survivor is not None:
                    self.process, survivor = survivor, None
                else:
                    self.process = await self._spawn(self.spec)
                    await self._record(self.spec, self.process.pid)
            except OSError as err:
                log.error("child.spawn_failed", child=self.spec.name, error=str(err))
                code: int | None = None
            else:
                self.starts += 1
                log.info(
                    "child.started",
                    child=self.spec.name,
                    pid=self.process.pid,
                    log=self.spec.log_path,
                    restarts=self.starts - 1,
                    adopted=self.adopted and self.starts == 1,
                )
                if self._stopping:  # stop() came while it was being spawned
                    self._kill_group(self.process.pid, signal.SIGKILL)
                    return
                code = await self.process.wait()
            if self._stopping:
                return
            if self.process is not None:
                # what the leader left in its group (a raylet after its `ray start`) goes too
                self._kill_group(self.process.pid, signal.SIGKILL)
                self.process = None
            self.failures = failures_after_exit(
                self.failures, self._now() - started, stable_s=self._stable_s
            )
            delay = restart_delay_s(self.failures, cap_s=self._backoff_cap_s)
            log.warning(
                "child.exited",
                child=self.spec.name,
                exit_code=code,
                restart_in_s=delay,
                log=self.spec.log_path,
            )
            await self._clock.sleep(delay)

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the child's process group, SIGKILL it after ``grace_s``."""
        self._stopping = True
        proc = self.process
        if proc is not None:
            self._kill_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await within(self._clock, grace_s, asyncio.shield(proc.wait()))
            # the group outlives its leader (raylet workers, dashboard modules): kill the rest
            self._kill_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                await self._record(self.spec, None)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._tasks.close()


def default_python(configured: str) -> str:
    return configured or sys.executable


def child_env(python: str, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``python``'s directory first on ``PATH`` (as an activated venv has it):
    what the children run by name (the raylet's workers, a job's ``python script.py``)
    comes from the Ray install."""
    bin_dir = os.path.dirname(python)
    path = base.get("PATH", "")
    return {**base, "PATH": f"{bin_dir}{os.pathsep}{path}" if path else bin_dir}


class HeadChildren:
    """``--dashboard`` / ``--head-raylet`` as a component: started once the GCS serves
    (they call it), stopped first when it stops (the head raylet unregisters and the
    dashboard exits while the GCS still answers them)."""

    name = "head_children"

    def __init__(
        self,
        *,
        head: bool,
        dashboard: bool,
        head_raylet: bool,
        ray_python: str,
        temp_dir: str,
        dashboard_host: str,
        dashboard_port: int,
        head_raylet_args: str,
        session_name: Callable[[], str],
        cluster_id_hex: Callable[[], str],
        gcs_address: Callable[[], str],
        node_ip: str,
        serving: Callable[[], Awaitable[object]],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``session_name``, ``cluster_id_hex``, ``gcs_address``: read once serving.
        ``clock``: the children's restart backoff and stop grace run on it."""
        self._wanted = head and (dashboard or head_raylet)
        self._dashboard = dashboard
        self._head_raylet = head_raylet
        self._python = ray_python
        self._temp_dir = temp_dir
        self._dashboard_host = dashboard_host
        self._dashboard_port = dashboard_port
        self._head_raylet_args = head_raylet_args
        self._session_name = session_name
        self._cluster_id_hex = cluster_id_hex
        self._gcs_address = gcs_address
        self._node_ip = node_ip
        self._serving = serving
        self._clock = clock
        self.children: list[SupervisedChild] = []

    async def load(self) -> None:
        return None

    async def run(self) -> None:
        if not self._wanted:
            return
        await self._serving()
        for spec in await self._specs():
            child = SupervisedChild(spec, self._clock)
            child.start()
            self.children.append(child)

    async def _specs(self) -> list[ChildSpec]:
        python = default_python(self._python)
        env = child_env(python, os.environ)
        session = session_dir(self._temp_dir, self._session_name())
        logs = session / "logs"
        await asyncio.to_thread(logs.mkdir, parents=True, exist_ok=True)
        address = self._gcs_address()
        specs = []
        if self._dashboard:
            argv = dashboard_argv(
                python,
                host=self._dashboard_host,
                port=self._dashboard_port,
                gcs_address=address,
                cluster_id_hex=self._cluster_id_hex(),
                node_ip=self._node_ip,
                temp_dir=self._temp_dir,
                session_dir=session,
            )
            specs.append(ChildSpec("dashboard", argv, str(logs / "dashboard.out"), env))
            log.info(
                "dashboard.starting",
                url=f"http://{advertised_host(self._dashboard_host)}:{self._dashboard_port}",
                log=str(logs / DASHBOARD_LOG),
            )
            if not self._head_raylet:
                log.warning(
                    "dashboard.no_head_raylet",
                    hint="`ray job submit` waits for a head node's agent: add --head-raylet",
                )
        if self._head_raylet:
            argv = head_raylet_argv(
                python,
                gcs_address=address,
                node_ip=self._node_ip,
                temp_dir=self._temp_dir,
                extra_args=shlex.split(self._head_raylet_args),
            )
            specs.append(
                ChildSpec(
                    "head-raylet",
                    argv,
                    str(logs / "gcs_head_raylet.out"),
                    env,
                    pidfile=str(logs / "gcs_head_raylet.pid"),
                )
            )
        return specs

    async def close(self) -> None:
        children, self.children = self.children, []
        await asyncio.gather(*(child.stop() for child in reversed(children)))
