"""Every shell example of the README runs as written (on free ports).

The README's ``bash`` blocks are read from the file, not copied here.  Fixed ports in
them (46379/9379 demo, 6380 a server, 6379 Redis, 5432 PostgreSQL, 9380 metrics) are
swapped for free ones, ``/var/lib/gcs`` for a temporary directory, and commands run with
the repository as working directory and ``.venv/bin`` on PATH.  Long-running commands
(``scripts/demo.sh``, ``gcs serve``, ``gcs raylet``) are started, checked to be serving,
then stopped with a signal and must exit cleanly.  A new ``bash`` block the test does not
know fails the test, so the README cannot grow examples nobody runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gcs.testing.ports import free_port
from gcs.testing.postgres import PostgresServer
from gcs.testing.processes import MissingServerBinary
from gcs.testing.redis_server import RedisServer
from tests.interop import venvs

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    heading: str
    index: int
    """Position among the bash blocks under this heading."""
    lines: tuple[str, ...]


def bash_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    heading = ""
    counts: dict[str, int] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.strip() == "```bash":
            body: list[str] = []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            commands: list[str] = []
            for raw in body:
                if commands and commands[-1].endswith("\\"):
                    commands[-1] = commands[-1][:-1] + raw.strip()
                elif raw.strip() and not raw.strip().startswith("#"):
                    commands.append(raw.strip())
            index = counts.get(heading, 0)
            counts[heading] = index + 1
            blocks.append(Block(heading, index, tuple(commands)))
        i += 1
    return blocks


BLOCKS = {(b.heading, b.index): b for b in bash_blocks(README.read_text())}
KNOWN = {
    ("Two commands", 0),
    ("Quickstart (with the demo running, in another shell)", 0),
    ("Quickstart (with the demo running, in another shell)", 1),
    ("Running a server", 0),
    ("Running a server", 1),
    ("Autoscaler", 0),
}


def test_every_bash_block_is_exercised() -> None:
    assert set(BLOCKS) == KNOWN, "a README bash block changed: teach tests/cli/test_readme.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GCS_", "RAY_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _substitute(command: str, ports: dict[str, int], tmp: Path) -> str:
    out = command.replace("/var/lib/gcs", str(tmp / "abs"))
    for literal, port in ports.items():
        out = re.sub(rf"(?<![0-9]){literal}(?![0-9])", str(port), out)
    return out


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before serving")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listening on {host}:{port} after {timeout_s} s")


def _health(address: str) -> None:
    result = subprocess.run(
        ["gcs", "health", "--address", address],
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "SERVING", result.stderr


def _wait_live_nodes(address: str, *, at_least: int, timeout_s: float) -> None:
    """The autoscaled demo's provider brings the nodes up after the server serves: waited
    for with the request ``gcs status`` makes (in this process: a ``gcs status`` process per
    poll cost ~0.5 CPU s), then checked once with the command itself."""
    from gcs.proto import autoscaler_pb2
    from gcs.sdk import GcsSdkError, get_cluster_status

    up = {autoscaler_pb2.RUNNING, autoscaler_pb2.IDLE}
    deadline = time.monotonic() + timeout_s
    live = 0
    while time.monotonic() < deadline:
        try:
            reply = get_cluster_status(address=address, timeout_s=30)
        except GcsSdkError:  # not serving yet: as the command's exit 1 before
            reply = None
        if reply is not None:
            states = reply.cluster_resource_state.node_states
            live = sum(1 for n in states if n.status in up)
            if live >= at_least:
                break
        time.sleep(0.5)
    else:
        raise AssertionError(f"{live} live nodes after {timeout_s} s, wanted {at_least}")
    result = subprocess.run(
        ["gcs", "status", "--address", address, "--format", "json"],
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    states = json.loads(result.stdout)["cluster_resource_state"]
    live = sum(1 for n in states.get("node_states", []) if n.get("status") in ("RUNNING", "IDLE"))
    assert live >= at_least, result.stdout


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("did not stop on a signal within 30 s") from None
    return proc.returncode


@pytest.fixture(scope="class")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """``scripts/demo.sh`` as written (free ports, a private data dir).  For
    :class:`TestQuickstart` only: stopped after it, not left scaling under its synthetic
    load through the rest of the module."""
    (line,) = [c for c in BLOCKS[("Two commands", 0)].lines if "demo.sh" in c]
    ports = {"46379": free_port(), "9379": free_port()}
    data = tmp_path_factory.mktemp("demo-data")
    env = _env(
        GCS_PORT=str(ports["46379"]),
        GCS_METRICS_PORT=str(ports["9379"]),
        GCS_DATA_DIR=str(data),
    )
    proc = subprocess.Popen(
        ["bash", "-c", line], cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_port("127.0.0.2", ports["46379"], proc, timeout_s=120)
        _health(f"127.0.0.2:{ports['46379']}")
        _wait_live_nodes(f"127.0.0.2:{ports['46379']}", at_least=4, timeout_s=180)
        yield ports
    finally:
        code = _stop(proc, signal.SIGINT)
    assert code == 0, f"scripts/demo.sh exited {code} on Ctrl-C"
    assert (data / "gcs.sqlite3").exists()


class TestTwoCommands:
    def test_block_is_the_two_scripts(self) -> None:
        """test.sh is this very suite; demo.sh is run by the ``demo`` fixture."""
        assert BLOCKS[("Two commands", 0)].lines == ("scripts/demo.sh", "scripts/test.sh")


class TestQuickstart:
    def test_commands_run_against_the_demo(self, demo: dict[str, int], tmp_path: Path) -> None:
        """The quickstart block, as one shell session (activation and export carry over)."""
        block = BLOCKS[("Quickstart (with the demo running, in another shell)", 0)]
        script = "\n".join(
            ["set -euo pipefail", *(_substitute(c, demo, tmp_path) for c in block.lines)]
        )
        result = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, env=_env(), capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
        assert "Traceback" not in result.stderr
        alive = re.search(r'^gcs_nodes\{state="ALIVE"\} (\d+)\.0$', result.stdout, re.M)
        assert alive and int(alive.group(1)) >= 4, result.stdout  # head + min workers
        assert "SERVING" in result.stdout

    @pytest.mark.interop
    def test_ray_tools_reach_the_demo(
        self, ray_venv: venvs.Venv, demo: dict[str, int], tmp_path: Path
    ) -> None:
        """``ray status`` and Ray's GcsClient, from the cached ray==2.60.0 venv."""
        venv = ray_venv.path
        block = BLOCKS[("Quickstart (with the demo running, in another shell)", 1)]
        env = _env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
        for command in block.lines:
            result = subprocess.run(
                ["bash", "-c", _substitute(command, demo, tmp_path)], cwd=ROOT, env=env,
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
            if command.startswith("ray status"):
                assert "cpu4" in result.stdout and "gpu1" in result.stdout, result.stdout
            else:  # the autoscaled demo: head + 2 cpu4 + 1 gpu1 at least (more while scaling)
                count, word = result.stdout.strip().split()
                assert word == "nodes" and int(count) >= 4, result.stdout


SERVER_LINES = BLOCKS[("Running a server", 0)].lines


@pytest.fixture(scope="module")
def backends() -> Iterator[dict[str, int]]:
    """Redis and PostgreSQL for the storage examples (started only if installed)."""
    ports: dict[str, int] = {}
    started: list[RedisServer | PostgresServer] = []
    try:
        try:
            redis = RedisServer().start()
            started.append(redis)
            ports["6379"] = redis.port
        except MissingServerBinary:
            pass
        try:
            postgres = PostgresServer().start()
            started.append(postgres)
            ports["5432"] = postgres.port
        except MissingServerBinary:
            pass
        yield ports
    finally:
        for server in started:
            server.cleanup()


class TestRunningAServer:
    @pytest.mark.parametrize("line", SERVER_LINES, ids=lambda c: " ".join(c.split()[1:3]))
    def test_example_serves_or_completes(
        self, line: str, backends: dict[str, int], tmp_path: Path
    ) -> None:
        """``gcs serve`` examples come up healthy and stop on SIGTERM; the rest exit 0."""
        command = line.split("  #", maxsplit=1)[0].strip()
        needs = [p for p in ("6379", "5432") if re.search(rf":{p}\b", command)]
        missing = [p for p in needs if p not in backends]
        if missing:
            pytest.skip(f"no local server binary for port {missing[0]} in this environment")
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        # relative paths in the examples (examples/gcs.yaml) are the repository's
        command = command.replace("examples/", f"{ROOT}/examples/")
        grpc_port, metrics_port = free_port(), free_port()
        ports = {"6380": grpc_port, "9380": metrics_port, **backends}
        command = _substitute(command, ports, tmp_path)
        (tmp_path / "abs").mkdir()
        env = _env(
            GCS_PORT=str(grpc_port), GCS_METRICS_PORT=str(metrics_port), GCS_LOG_FORMAT="json"
        )
        argv = shlex.split(command)
        assert argv[0] == "gcs", command
        if argv[1] != "serve":
            result = subprocess.run(
                argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                check=False,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            return
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            _wait_port("127.0.0.1", grpc_port, proc, timeout_s=120)
            _health(f"127.0.0.1:{grpc_port}")
        except AssertionError as failure:
            _stop(proc)
            raise AssertionError(f"{failure}; stderr: {proc.communicate()[1].decode()}") from None
        except BaseException:
            _stop(proc)
            raise
        code = _stop(proc)
        out, err = proc.communicate()
        assert code == 0, err.decode()
        assert out == b"", "stdout is for command output; logs go to stderr"
        events = []
        for log_line in err.decode().splitlines():
            try:
                events.append(json.loads(log_line)["event"])
            except (ValueError, KeyError):
                raise AssertionError(f"not a JSON log line on stderr: {log_line!r}") from None
        assert "gcs.serving" in events  # every stderr line is JSON (no plain prints)
        if "sqlite:///gcs-data" in command:
            assert (cwd / "gcs-data" / "gcs.sqlite3").exists()  # relative to the cwd
        if "sqlite:////" in command:
            assert (tmp_path / "abs" / "gcs.sqlite3").exists()  # absolute

    def test_raylet_and_submit_examples(self, tmp_path: Path) -> None:
        """Against a server on the example's address: the raylet registers (JSON on
        stdout), submit places and finishes its tasks, Ctrl-C unregisters the raylet."""
        lines = BLOCKS[("Running a server", 1)].lines
        port = free_port()
        ports = {"6380": port}
        server = subprocess.Popen(
            ["gcs", "serve", "--port", str(port), "--storage", "memory://",
             "--metrics-port", "-1"],
            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        raylet = None
        try:
            _wait_port("127.0.0.1", port, server, timeout_s=120)
            raylet_line, submit_line = lines
            raylet = subprocess.Popen(
                shlex.split(_substitute(raylet_line, ports, tmp_path)), env=_env(),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert raylet.stdout is not None
            registered = json.loads(raylet.stdout.readline())
            assert len(registered["node_id"]) == 56
            result = subprocess.run(
                shlex.split(_substitute(submit_line, ports, tmp_path)), env=_env(),
                capture_output=True, text=True, timeout=180, check=False,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            summary = json.loads(result.stdout)
            assert summary["granted"] == 4 and summary["timed_out"] == 0, summary
            assert _stop(raylet, signal.SIGINT) == 0
        finally:
            if raylet is not None and raylet.poll() is None:
                raylet.kill()
                raylet.wait()
            _stop(server)


class TestAutoscaler:
    def test_local_cluster_comes_up_and_stops_with_the_server(self, tmp_path: Path) -> None:
        """The embedded autoscaler starts the head and min_workers as raylet processes;
        Ctrl-C stops the server and the local cluster with it."""
        serve_line = BLOCKS[("Autoscaler", 0)].lines[0]
        port = free_port()
        command = _substitute(serve_line, {"6380": port}, tmp_path)
        command = command.replace("examples/", f"{ROOT}/examples/")
        proc = subprocess.Popen(
            [*shlex.split(command), "--metrics-port", "-1", "--data-dir", str(tmp_path / "d")],
            env=_env(AUTOSCALER_UPDATE_INTERVAL_S="0.5"), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            _wait_port("127.0.0.1", port, proc, timeout_s=120)
            # the head and one cpu4 worker (min_workers), started by the local provider
            _wait_live_nodes(f"127.0.0.1:{port}", at_least=2, timeout_s=180)
        finally:
            code = _stop(proc, signal.SIGINT)
        assert code == 0, proc.communicate()[1].decode()[-2000:]
        leftover = subprocess.run(
            ["pgrep", "-f", f"gcs raylet --gcs-address 127.0.0.1:{port}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert leftover.stdout.strip() == "", "raylet processes outlived the server"

    # A day of the example workload is CPU-bound work: ~110 s in a run at load ~7,
    # 300+ s with the suite at -n 4 on a shared 2-core machine (profile: over a third in
    # building AutoscalingState each round).  The deadline bounds a hang, not the speed.
    @pytest.mark.timeout(1200)
    def test_simulator_writes_a_timeline_and_a_summary(self, tmp_path: Path) -> None:
        line = BLOCKS[("Autoscaler", 0)].lines[1].replace("examples/", f"{ROOT}/examples/")
        result = subprocess.run(
            [*shlex.split(line), "--no-progress"], cwd=tmp_path, env=_env(),
            capture_output=True, text=True, timeout=1100, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "time to capacity" in result.stdout
        png = tmp_path / "report" / "timeline.png"
        assert png.read_bytes()[:4] == b"\x89PNG"
        assert json.loads((tmp_path / "report" / "summary.json").read_text())["tasks"]["total"]


def test_configuration_reference_is_current() -> None:
    """docs/configuration.md is what ``python -m gcs.cli.config_reference`` prints."""
    from gcs.cli.config_reference import render

    assert (ROOT / "docs" / "configuration.md").read_text() == render(), (
        "regenerate: python -m gcs.cli.config_reference > docs/configuration.md"
    )
