"""Every CLI failure is one line on stderr and a non-zero exit, never a traceback.

Each command runs as a real process (as a user types it) against nothing (127.0.0.1:1), a
busy port, or bad input.  Exit codes: 1 the operation failed, 2 bad usage/input.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gcs.testing.ports import free_port
from tests.forked_cli import ForkedCli

NOTHING = "127.0.0.1:1"
GCS = [sys.executable, "-m", "gcs"]
"""``python -m`` runs the checkout under test (a console script runs the installed copy)."""


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"GCS_ADDRESS", "RAY_ADDRESS", "GCS_DEBUG"} and not k.startswith("GCS_")
    }
    env.update(extra)
    return env


@pytest.fixture
def run(gcs_cli: ForkedCli) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``python -m gcs *args`` (stdin /dev/null, output captured), a process forked from
    one that has imported the CLI (:mod:`tests.forked_cli`)."""

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return gcs_cli.run(args, env=env or _env(), timeout=timeout)

    return run


Run = Callable[..., subprocess.CompletedProcess[str]]


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    where = f"stdout={result.stdout!r} stderr={result.stderr!r}"
    assert "Traceback" not in result.stderr + result.stdout, where
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), where
    assert result.returncode == code, where
    assert result.stdout == "", where
    return lines[0]


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster_yaml(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cfg") / "cluster.yaml"
    path.write_text(
        "head_node_type: head\navailable_node_types:\n"
        "  head: {resources: {CPU: 0}, max_workers: 0}\n"
        "  cpu4: {resources: {CPU: 4}, max_workers: 5}\n"
    )
    return str(path)


UNREACHABLE = [
    ("status", "--address", NOTHING),
    ("status", "--address", NOTHING, "--format", "json"),
    ("vcluster", "list", "--address", NOTHING),
    ("vcluster", "show", "vc1", "--address", NOTHING),
    ("vcluster", "create", "--id", "vc1", "--address", NOTHING),
    ("submit", "--address", NOTHING, "--detach"),
    ("submit", "--gcs-address", NOTHING),
    ("request-resources", "--address", NOTHING, "--num-cpus", "4"),
    ("raylet", "--address", NOTHING, "--register-timeout", "1"),
]


class TestUnreachable:
    @pytest.mark.parametrize("args", UNREACHABLE, ids=lambda a: " ".join(a[:2]))
    def test_one_line_exit_1(self, run: Run, args: tuple[str, ...]) -> None:
        """An address where nothing listens: one line naming the failure, exit 1."""
        line = assert_one_line_error(run(*args), 1)
        assert "127.0.0.1:1" in line or "unreachable" in line or "cannot reach" in line

    def test_autoscaler_plan_honours_gcs_address(self, run: Run, cluster_yaml: str) -> None:
        """No --address: GCS_ADDRESS is used (and, as nothing listens there, one line)."""
        result = run("autoscaler", "plan", "--config", cluster_yaml, env=_env(GCS_ADDRESS=NOTHING))
        line = assert_one_line_error(result, 1)
        assert NOTHING in line

    def test_no_address_anywhere_is_a_usage_error(self, run: Run) -> None:
        line = assert_one_line_error(run("status"), 2)
        assert "GCS_ADDRESS" in line


BAD_INPUT = [
    (("submit", "--address", NOTHING, "--resources", '{"CPU": 1e309}'), "--resources"),
    (("submit", "--address", NOTHING, "--resources", '{"CPU": NaN}'), "--resources"),
    (("submit", "--address", NOTHING, "--resources", '{"CPU": Infinity}'), "--resources"),
    (("submit", "--address", NOTHING, "--resources", '{"CPU": -2}'), "CPU"),
    (("submit", "--address", NOTHING, "--resources", '{"CPU": "x"}'), "CPU"),
    (("submit", "--address", NOTHING, "--resources", "[1]"), "--resources"),
    (("submit", "--address", NOTHING, "--count", "-3"), "--count"),
    (("submit", "--address", NOTHING, "--seconds", "nan"), "--seconds"),
    (("submit", "--address", NOTHING, "--timeout", "0"), "--timeout"),
    (("raylet", "--address", NOTHING, "--resources", '{"CPU": -4}'), "CPU"),
    (("raylet", "--address", NOTHING, "--node-id", "zz"), "--node-id"),
    (("raylet", "--address", NOTHING, "--port", "99999"), "--port"),
    (("raylet", "--address", NOTHING, "--labels", '{"zone": 1}'), "--labels"),
    (("raylet-fleet", "--address", NOTHING, "--count", "0"), "--count"),
    (("request-resources", "--address", NOTHING, "--num-cpus", "-5"), "--num-cpus"),
    (("request-resources", "--address", NOTHING, "--bundles", '[{"GPU": 1e400}]'), "--bundles"),
    (("request-resources", "--address", NOTHING, "--bundles", '[{"GPU": -1}]'), "--bundles"),
    (("status", "--address", "nonsense"), "--address"),
    (("status", "--address", "127.0.0.1:99999"), "--address"),
    (("vcluster", "create", "--id", "a", "--replica-sets", '{"x": -1}'), "--replica-sets"),
    (("vcluster", "update", "--id", "a", "--revision", "-1"), "--revision"),
    (("serve", "--log-level", "LOUD"), "--log-level"),
    (("serve", "--storage", "bogus://x"), "--storage"),
    (("serve", "--demo", "-2"), "--demo"),
    (("serve", "--port", "99999"), "--port"),
    (("serve", "--metrics-port", "-7"), "--metrics-port"),
    (("status", "--bogus-flag"), "--bogus-flag"),
]


class TestBadInput:
    @pytest.mark.parametrize(("args", "field"), BAD_INPUT, ids=lambda a: " ".join(a[-2:]))
    def test_rejected_with_the_field_named(
        self, run: Run, args: tuple[str, ...], field: str
    ) -> None:
        """Bad numbers and JSON never reach a request: exit 2, the field named."""
        line = assert_one_line_error(run(*args), 2)
        assert field in line

    def test_a_poll_period_that_is_no_number_is_rejected(self, run: Run) -> None:
        """(0 is Ray's "no load pull", tests/dropin/test_ray_config_meaning.py.)"""
        env = _env(RAY_gcs_pull_resource_loads_period_milliseconds="1s")
        line = assert_one_line_error(run("serve", "--storage", "memory://", env=env), 2)
        assert "RAY_gcs_pull_resource_loads_period_milliseconds" in line

    def test_bad_config_file_key(self, run: Run, tmp_path: Path) -> None:
        path = tmp_path / "gcs.yaml"
        path.write_text("bogus_knob: 1\n")
        line = assert_one_line_error(run("serve", "--config", str(path)), 2)
        assert "bogus_knob" in line


class TestBusyPorts:
    def test_serve_grpc_port_in_use(self, run: Run, busy_port: int) -> None:
        result = run("serve", "--storage", "memory://", "--port", str(busy_port))
        line = assert_one_line_error(result, 1)
        assert str(busy_port) in line and "--port" in line

    def test_serve_metrics_port_in_use(self, run: Run, busy_port: int) -> None:
        result = run(
            "serve", "--storage", "memory://", "--port", "0", "--metrics-port", str(busy_port)
        )
        line = assert_one_line_error(result, 1)
        assert str(busy_port) in line and "--metrics-port" in line


class TestDebugAndHelp:
    @pytest.mark.parametrize("args", [(), ("vcluster",), ("autoscaler",)])
    def test_group_without_a_command_shows_its_help(self, run: Run, args: tuple[str, ...]) -> None:
        """Not an error squeezed into one line: the group's help, as click prints it."""
        result = run(*args)
        text = result.stdout + result.stderr
        assert "Commands:" in text and len(text.splitlines()) > 3, text
        assert "Traceback" not in text

    def test_debug_shows_the_traceback(self, run: Run) -> None:
        result = run("--debug", "status", "--address", NOTHING)
        assert result.returncode != 0 and "Traceback" in result.stderr

    @pytest.mark.parametrize(
        "args",
        [
            (),
            ("serve",),
            ("status",),
            ("submit",),
            ("raylet",),
            ("raylet-fleet",),
            ("request-resources",),
            ("vcluster",),
            ("vcluster", "show"),
            ("autoscaler", "plan"),
            ("db", "upgrade"),
        ],
    )
    def test_dash_h_everywhere(self, run: Run, args: tuple[str, ...]) -> None:
        result = run(*args, "-h")
        assert result.returncode == 0 and "Usage:" in result.stdout, result.stderr


class TestRayletSignal:
    def test_sigint_unregisters_the_node(self) -> None:
        """Ctrl-C on `gcs raylet`: the GCS marks the node DEAD (EXPECTED_TERMINATION) at
        once instead of finding it dead by health checks later; stdout is only JSON."""
        from gcs.proto import gcs_pb2, gcs_service_pb2
        from gcs.rpc.descriptors import NODE_INFO
        from gcs.sdk import GcsClient

        port = free_port()
        server = subprocess.Popen(
            [*GCS, "serve", "--storage", "memory://", "--port", str(port),
             "--metrics-port", "-1", "--log-format", "json"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
        )  # fmt: skip
        raylet = None
        try:
            address = f"127.0.0.1:{port}"
            # the server may still be starting: registration retries; a loaded machine can
            # take longer than the default 30 s to bring `gcs serve` up
            raylet = subprocess.Popen(
                [*GCS, "raylet", "--address", address, "--log-level", "info",
                 "--register-timeout", "300", "--format", "json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
            )  # fmt: skip
            assert raylet.stdout is not None
            first = raylet.stdout.readline()
            node_id = json.loads(first)["node_id"]  # stdout: the JSON result, not logs
            raylet.send_signal(signal.SIGINT)
            out, err = raylet.communicate(timeout=30)
            assert raylet.returncode == 0, err
            assert out == "" and "Traceback" not in err
            with GcsClient(address) as client:
                reply = client.call(
                    NODE_INFO,
                    "GetAllNodeInfo",
                    gcs_service_pb2.GetAllNodeInfoRequest(),
                )
            nodes = {n.node_id.hex(): n for n in reply.node_info_list}
            node = nodes[node_id]
            assert node.state == gcs_pb2.GcsNodeInfo.DEAD
            assert node.death_info.reason == node.death_info.EXPECTED_TERMINATION
        finally:
            for proc in (raylet, server):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()

    @pytest.mark.parametrize(
        ("command", "sig"),
        [
            (("raylet",), signal.SIGTERM),
            (("raylet",), signal.SIGINT),
            (("raylet-fleet", "--count", "2"), signal.SIGTERM),
        ],
        ids=["raylet-SIGTERM", "raylet-SIGINT", "fleet-SIGTERM"],
    )
    def test_a_signal_while_waiting_to_register_stops_it_at_once(
        self, command: tuple[str, ...], sig: signal.Signals
    ) -> None:
        """A pod deleted while its raylet waits for the GCS stops in seconds, not at
        --register-timeout (it used to ignore SIGTERM/Ctrl-C for the whole wait)."""
        import time

        address = f"127.0.0.1:{free_port()}"  # nothing listens there
        proc = subprocess.Popen(
            [*GCS, *command, "--address", address, "--register-timeout", "120"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            notice = proc.stderr.readline()  # printed once the wait passed 2 s
            assert notice.startswith("Waiting for the GCS at"), notice
            sent = time.monotonic()
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=60)
            took_s = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert took_s < 10, took_s
        assert proc.returncode == 0, err
        assert out == "" and "Traceback" not in err
        assert err.strip().splitlines() == [
            f"Stopped by a signal before the GCS at {address} accepted the registration"
        ]


class TestRayletGcsGone:
    def test_the_raylet_exits_once_its_gcs_has_been_gone_for_the_timeout(self) -> None:
        """Ray's raylet exits after gcs_rpc_server_reconnect_timeout_s without its GCS; so
        does ours: exit 1 with one line naming the GCS and the timeout (agents used to
        outlive their GCS for good)."""
        import time

        port = free_port()
        server = subprocess.Popen(
            [*GCS, "serve", "--storage", "memory://", "--port", str(port),
             "--metrics-port", "-1", "--log-format", "json"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
        )  # fmt: skip
        raylet = None
        try:
            address = f"127.0.0.1:{port}"
            raylet = subprocess.Popen(
                [*GCS, "raylet", "--address", address, "--register-timeout", "300",
                 "--format", "json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=_env(RAY_gcs_rpc_server_reconnect_timeout_s="3"),
            )  # fmt: skip
            assert raylet.stdout is not None
            json.loads(raylet.stdout.readline())  # registered
            server.kill()
            server.wait()
            killed = time.monotonic()
            _out, err = raylet.communicate(timeout=60)
            took_s = time.monotonic() - killed
        finally:
            for proc in (raylet, server):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert 3 <= took_s < 20, took_s
        # a registration slower than WAITING_NOTICE_AFTER_S (a loaded machine) printed its
        # notice first: what the exit says is the rest
        notice = f"Waiting for the GCS at {address} to accept the registration"
        lines = [line for line in err.splitlines() if line.strip() and notice not in line]
        assert raylet.returncode == 1, err
        assert len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith(f"Error: the GCS at {address} has been unreachable for 3 s")


class TestServeStoreDown:
    def test_a_signal_while_waiting_for_the_store_stops_it_at_once(self) -> None:
        """`gcs serve` waiting for a store that is down (Ray's 60 s budget) stops in seconds
        on SIGTERM (it used to wait the whole budget out)."""
        import time

        proc = subprocess.Popen(
            [*GCS, "serve", "--storage", "redis://127.0.0.1:1/0", "--port", "0",
             "--metrics-port", "-1", "--log-format", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # the first failed attempt is logged at once
                if json.loads(line).get("event") == "store.unavailable":
                    break
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=60)
            took_s = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert took_s < 10, took_s
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "Error:" not in err, err


class TestRayAddressAuto:
    def test_auto_is_the_cluster_ray_start_recorded(self, run: Run, tmp_path: Path) -> None:
        """RAY_ADDRESS=auto reads <RAY_TMPDIR>/ray/ray_current_cluster, as Ray does: the
        command then talks to the GCS recorded there (here nothing listens: exit 1 naming
        that address).  It used to say "set GCS_ADDRESS / RAY_ADDRESS" though it was set."""
        (tmp_path / "ray").mkdir()
        (tmp_path / "ray" / "ray_current_cluster").write_text(f"{NOTHING}\n")
        result = run("status", env=_env(RAY_ADDRESS="auto", RAY_TMPDIR=str(tmp_path)))
        line = assert_one_line_error(result, 1)
        assert line.startswith(f"Error: cannot reach the GCS at {NOTHING} ("), line

    def test_address_auto_flag_too(self, run: Run, tmp_path: Path) -> None:
        (tmp_path / "ray").mkdir()
        (tmp_path / "ray" / "ray_current_cluster").write_text(NOTHING)
        result = run("status", "--address", "auto", env=_env(RAY_TMPDIR=str(tmp_path)))
        assert assert_one_line_error(result, 1).startswith(
            f"Error: cannot reach the GCS at {NOTHING}"
        )


class TestServeStartedLine:
    def test_metrics_off_is_said_as_off(self) -> None:
        """`--metrics-port -1`: the started lines say metrics_port "off" (was 0, a port
        number that means "any free port" to the same flag)."""
        proc = subprocess.Popen(
            [*GCS, "serve", "--storage", "memory://", "--port", "0", "--metrics-port", "-1",
             "--log-format", "json"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(),
        )  # fmt: skip
        events: dict[str, dict[str, object]] = {}
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                event = json.loads(line)
                events[str(event.get("event"))] = event
                if "gcs.serving" in events:
                    break
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert events["gcs.started"]["metrics_port"] == "off"
        assert events["gcs.serving"]["metrics_port"] == "off"
