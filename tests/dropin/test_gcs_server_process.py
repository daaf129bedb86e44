"""``gcs-server`` as Ray starts its ``gcs_server``: Ray's command line, the port file, the log
files, RayConfig served to raylets, Ray's KV flags, SIGTERM, and one-line refusals."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc

NODE_ID = "cd" * 28
KNOBS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "object_spilling_config": '{"type": "filesystem", "params": {"directory_path": "/x"}}',
    "automatic_object_spilling_enabled": True,
}


def ray_argv(session: pathlib.Path, knobs: dict[str, object] = KNOBS) -> list[str]:
    """What Ray 2.60's ``services.start_gcs_server`` passes (no Redis)."""
    logs = session / "logs"
    return [
        f"--log_dir={logs}",
        "--config_list=" + base64.b64encode(json.dumps(knobs).encode()).decode(),
        "--gcs_server_port=0",
        "--metrics-agent-port=0",
        "--node-ip-address=127.0.0.1",
        "--session-name=session_dropin_test",
        "--ray-commit=b7f4259e944bf6959f721b106adc366ddfa0c356",
        f"--session-dir={session}",
        f"--node-id={NODE_ID}",
        f"--stdout_filepath={logs / 'gcs_server.out'}",
        f"--stderr_filepath={logs / 'gcs_server.err'}",
    ]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "GCS_"))}
    env["PYTHONPATH"] = str(pathlib.Path(__file__).resolve().parents[2])
    return env


@contextlib.contextmanager
def serving_gcs_server(
    session: pathlib.Path, knobs: dict[str, object] = KNOBS
) -> Iterator[subprocess.Popen[str]]:
    """``gcs-server`` with Ray's command line, once it serves; killed (its group) after.
    Its stdout is not redirected (no ``--stdout_filepath``): the caller reads the log lines
    Ray would find in ``gcs_server.out`` from ``proc.stdout``."""
    argv = [a for a in ray_argv(session, knobs) if not a.startswith("--stdout_filepath")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gcs.cli.dropin", *argv],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # bounded by the suite's per-test timeout
            if "gcs_server.serving" in line:
                break
        else:
            pytest.fail(f"gcs-server exited {proc.wait()} before serving")
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def gcs_server(tmp_path: pathlib.Path) -> Iterator[tuple[subprocess.Popen[str], pathlib.Path]]:
    """The test then reads the port file Ray would read."""
    session = tmp_path / "session"
    with serving_gcs_server(session) as proc:
        yield proc, session


def _run_to_exit(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gcs.cli.dropin", *argv],
        check=False,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )


def _call(port: int, method: str, request: object) -> object:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = ServiceStub(channel, svc.INTERNAL_KV, timeout_s=30)  # type: ignore[arg-type]
        return getattr(stub, method)(request)


class TestRunsAsRaysGcsServer:
    def test_port_file_config_flags_logs_and_sigterm(self, gcs_server) -> None:
        from gcs.proto import gcs_service_pb2 as pb

        proc, session = gcs_server
        port_file = session / f"gcs_server_port_{NODE_ID}"
        text = port_file.read_text()
        assert text.isdigit() and not text.endswith("\n")
        port = int(text)
        config = json.loads(_call(port, "GetInternalConfig", pb.GetInternalConfigRequest()).config)
        assert config == KNOBS  # served to raylets as Ray's GCS serves it
        v2 = _call(
            port,
            "InternalKVGet",
            pb.InternalKVGetRequest(namespace=b"__autoscaler", key=b"__autoscaler_v2_enabled"),
        )
        assert v2.value == b"0"  # RayConfig enable_autoscaler_v2 (default false)
        name = _call(
            port,
            "InternalKVGet",
            pb.InternalKVGetRequest(namespace=b"session", key=b"session_name"),
        )
        assert name.value == b"session_dropin_test"
        assert (session / "logs" / "gcs_server.err").exists()
        # `ray stop` finds the GCS by process name ("gcs_server" in comm), not command line
        comm = pathlib.Path(f"/proc/{proc.pid}/comm")
        if comm.exists():
            assert "gcs_server" in comm.read_text().strip()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


class TestRefusals:
    @pytest.mark.parametrize(
        ("extra", "knobs", "message"),
        [
            ([], {"health_check_timeout_ms": -1}, "gcs-server: config.health.timeout_ms"),
            (["--config_list=%%"], KNOBS, "gcs-server: --config_list: not a valid base64"),
            (["--redis_address=127.0.0.1"], KNOBS, "gcs-server: --redis_port: must be a port"),
        ],
    )
    def test_bad_config_is_one_line_in_gcs_server_err_and_exit_1(
        self, tmp_path: pathlib.Path, extra: list[str], knobs: dict[str, object], message: str
    ) -> None:
        """Once the command line is read, stderr is Ray's ``gcs_server.err``."""
        argv = [*ray_argv(tmp_path / "s", knobs), *extra]
        proc = _run_to_exit(argv)
        assert proc.returncode == 1
        err = (tmp_path / "s" / "logs" / "gcs_server.err").read_text().strip()
        assert err.startswith(message) and err.count("\n") == 0

    def test_a_bad_command_line_is_gflags_one_line_on_stderr(self, tmp_path) -> None:
        argv = [*ray_argv(tmp_path / "s"), "--bogus"]
        proc = _run_to_exit(argv)
        assert proc.returncode == 1
        assert proc.stderr.strip() == "ERROR: unknown command line flag 'bogus'"
