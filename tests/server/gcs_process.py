"""Run ``gcs serve`` as a real subprocess (for crash tests): start, wait, kill -9."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from gcs.testing.ports import free_port


@dataclass
class GcsProcess:
    storage: str
    port: int = field(default_factory=free_port)
    extra_args: tuple[str, ...] = ()
    log_path: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> GcsProcess:
        """Start and wait for the port; the deadline only bounds a hang (an exit is seen at
        once), so it is generous: a Python start takes seconds on a loaded 2-core machine."""
        args = [
            sys.executable,
            "-m",
            "gcs.cli.main",
            "serve",
            "--port",
            str(self.port),
            "--storage",
            self.storage,
            "--metrics-port",
            "-1",
            "--log-format",
            "json",
            *self.extra_args,
        ]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gcs serve exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("gcs serve did not start listening")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
