"""The Ray processes ``gcs serve --head`` supervises: command lines, restarts with backoff,
stop by process group (fake processes, fake sleep: no wall time), the head raylet's
promotion, the config that turns them on."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal

import pytest

from gcs.base.clock import Clock, FakeClock, SystemClock
from gcs.config import ConfigError, GcsConfig, validate
from gcs.managers.head import HEAD_RAYLET_LABEL, promote_head_raylet
from gcs.proto import gcs_pb2
from gcs.server.head_processes import (
    ChildSpec,
    SupervisedChild,
    adopt_survivor,
    child_env,
    dashboard_argv,
    failures_after_exit,
    head_raylet_argv,
    record_pid,
    restart_delay_s,
)


class FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def exit(self, code: int) -> None:
        if not self._exit.done():
            self._exit.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)


class RecordingClock(FakeClock):
    """Sleeps return at once, recorded, having moved the clock (no wall time)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)


class Fakes:
    def __init__(self, *, term_exits: bool = True) -> None:
        self.processes: list[FakeProcess] = []
        self.clock = RecordingClock()
        self.sleeps = self.clock.sleeps
        self.signals: list[tuple[int, signal.Signals]] = []
        self.term_exits = term_exits
        self.spawned = asyncio.Event()
        self.survivor: FakeProcess | None = None
        self.recorded: list[int | None] = []

    async def spawn(self, spec: ChildSpec) -> FakeProcess:
        proc = FakeProcess(100 + len(self.processes))
        self.processes.append(proc)
        self.spawned.set()
        return proc

    def kill_group(self, pid: int, sig: signal.Signals) -> None:
        self.signals.append((pid, sig))
        if sig == signal.SIGKILL or self.term_exits:
            for proc in self.processes:
                if proc.pid == pid:
                    proc.exit(-sig)

    async def adopt(self, spec: ChildSpec, clock: Clock) -> FakeProcess | None:
        return self.survivor

    async def record(self, spec: ChildSpec, pid: int | None) -> None:
        self.recorded.append(pid)

    def child(self, **kw: float) -> SupervisedChild:
        return SupervisedChild(
            ChildSpec("dashboard", ("ray-dashboard",), "/tmp/x.log"),
            self.clock,
            spawn=self.spawn,
            adopt=self.adopt,
            record=self.record,
            kill_group=self.kill_group,
            **kw,
        )

    async def next_start(self, count: int) -> FakeProcess:
        while len(self.processes) < count:
            self.spawned.clear()
            await self.spawned.wait()
        return self.processes[count - 1]


def test_restart_delays_double_up_to_the_cap_and_a_stable_run_resets_them() -> None:
    assert [restart_delay_s(n, cap_s=10) for n in range(0, 7)] == [0, 1, 2, 4, 8, 10, 10]
    assert failures_after_exit(3, ran_s=5, stable_s=60) == 4
    assert failures_after_exit(3, ran_s=60, stable_s=60) == 1
    assert restart_delay_s(10_000) == 60.0


async def test_a_child_that_dies_is_restarted_with_backoff_and_its_group_cleaned() -> None:
    fakes = Fakes()
    child = fakes.child(stable_s=60)
    child.start()
    first = await fakes.next_start(1)
    first.exit(1)  # crashes at once
    second = await fakes.next_start(2)
    assert fakes.sleeps == [1.0]
    assert (first.pid, signal.SIGKILL) in fakes.signals, "what the leader left is killed"
    second.exit(1)
    third = await fakes.next_start(3)
    assert fakes.sleeps == [1.0, 2.0]
    fakes.clock.advance(120)  # ran long enough: the next failure starts a new series
    third.exit(1)
    await fakes.next_start(4)
    assert fakes.sleeps == [1.0, 2.0, 1.0]
    assert child.starts == 4
    await child.stop(grace_s=5)


async def test_stop_terms_the_group_then_kills_it_and_does_not_restart() -> None:
    fakes = Fakes()
    child = fakes.child()
    child.start()
    proc = await fakes.next_start(1)
    await child.stop(grace_s=5)
    assert fakes.signals == [(proc.pid, signal.SIGTERM), (proc.pid, signal.SIGKILL)]
    await asyncio.sleep(0)
    assert len(fakes.processes) == 1


async def test_a_child_ignoring_sigterm_is_killed_after_the_grace() -> None:
    fakes = Fakes(term_exits=False)
    child = fakes.child()
    child.start()
    proc = await fakes.next_start(1)
    await child.stop(grace_s=0)
    assert fakes.signals == [(proc.pid, signal.SIGTERM), (proc.pid, signal.SIGKILL)]
    assert await proc.wait() == -signal.SIGKILL


async def test_a_survivor_of_the_last_gcs_is_adopted_not_started_again() -> None:
    fakes = Fakes()
    fakes.survivor = FakeProcess(42)
    child = fakes.child()
    child.start()
    await asyncio.sleep(0)
    assert child.adopted and fakes.processes == [] and child.process is fakes.survivor
    fakes.survivor.exit(0)  # it dies later: a new one is started and recorded
    proc = await fakes.next_start(1)
    assert fakes.recorded == [proc.pid]
    await child.stop(grace_s=5)
    assert fakes.recorded == [proc.pid, None], "a stopped child is forgotten"


async def test_only_a_live_process_running_the_same_command_is_adopted(
    tmp_path: pathlib.Path,
) -> None:
    argv = ("sleep", "1000")
    proc = await asyncio.create_subprocess_exec(*argv, start_new_session=True)
    try:
        pidfile = tmp_path / "child.pid"
        spec = ChildSpec("head-raylet", argv, str(tmp_path / "out"), pidfile=str(pidfile))
        assert await adopt_survivor(spec, SystemClock()) is None, "no pidfile yet"
        await record_pid(spec, proc.pid)
        adopted = await adopt_survivor(spec, SystemClock())
        assert adopted is not None and adopted.pid == proc.pid
        other = ChildSpec("head-raylet", ("sleep", "999"), "", pidfile=str(pidfile))
        assert await adopt_survivor(other, SystemClock()) is None, "another command line"
        proc.kill()
        assert await asyncio.wait_for(adopted.wait(), 60) == -1
        await record_pid(spec, None)
        assert not pidfile.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def test_the_dashboard_command_is_rays_start_api_server_one() -> None:
    argv = dashboard_argv(
        "/venv/bin/python",
        host="10.0.0.1",
        port=8265,
        gcs_address="10.0.0.1:6379",
        cluster_id_hex="ab" * 28,
        node_ip="10.0.0.1",
        temp_dir="/tmp/ray",
        session_dir=pathlib.Path("/tmp/ray/session_x"),
    )
    assert argv[:3] == ("/venv/bin/python", "-m", "ray.dashboard.dashboard")
    assert set(argv[3:]) >= {
        "--host=10.0.0.1",
        "--port=8265",
        "--gcs-address=10.0.0.1:6379",
        f"--cluster-id-hex={'ab' * 28}",
        "--node-ip-address=10.0.0.1",
        "--temp-dir=/tmp/ray",
        "--session-dir=/tmp/ray/session_x",
        "--log-dir=/tmp/ray/session_x/logs",
    }


def test_the_head_raylet_is_ray_start_with_the_head_label() -> None:
    argv = head_raylet_argv(
        "/venv/bin/python",
        gcs_address="10.0.0.1:6379",
        node_ip="10.0.0.1",
        temp_dir="/tmp/ray",
        extra_args=["--num-cpus=0"],
    )
    assert argv[:4] == ("/venv/bin/python", "-m", "ray.scripts.scripts", "start")
    assert "--address=10.0.0.1:6379" in argv and "--block" in argv
    assert f"--labels={HEAD_RAYLET_LABEL}=true" in argv and argv[-1] == "--num-cpus=0"


def test_children_find_the_ray_install_first_on_path() -> None:
    env = child_env("/venv/bin/python", {"PATH": "/usr/bin", "HOME": "/root"})
    assert env == {"PATH": "/venv/bin:/usr/bin", "HOME": "/root"}


def test_only_the_labelled_raylet_is_promoted_to_head() -> None:
    plain = gcs_pb2.GcsNodeInfo(node_id=b"\x01" * 28)
    assert not promote_head_raylet(plain) and not plain.is_head_node
    labelled = gcs_pb2.GcsNodeInfo(node_id=b"\x02" * 28, labels={HEAD_RAYLET_LABEL: "true"})
    assert promote_head_raylet(labelled) and labelled.is_head_node


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dashboard": True}, "dashboard (GCS_DASHBOARD): needs head"),
        ({"head_raylet": True}, "head_raylet (GCS_HEAD_RAYLET): needs head"),
        ({"head": True, "dashboard_port": 0}, "dashboard_port (GCS_DASHBOARD_PORT): must be in"),
        ({"head": True, "ray_python": "python"}, "ray_python (GCS_RAY_PYTHON): must be an abs"),
        ({"head": True, "head_raylet_args": "'open"}, "head_raylet_args (GCS_HEAD_RAYLET_ARGS)"),
    ],
)
def test_bad_dashboard_settings_are_refused_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(GcsConfig(**fields))
