"""Starting and stopping the private servers' processes: finding a binary (or naming the
package that provides it), waiting for a process to become ready, stopping it."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import time
from typing import Any

__all__ = ["MissingServerBinary", "find_binary", "stop_process", "wait_for", "wait_until"]


class MissingServerBinary(RuntimeError):
    """A server binary is not installed; the message says which package provides it."""


def find_binary(name: str, *, package: str) -> str:
    """``name`` on PATH or under ``/usr/lib/postgresql/*/bin`` (newest version first)."""
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        if os.access(candidate, os.X_OK):
            return candidate
    raise MissingServerBinary(
        f"{name!r} not found on PATH or in /usr/lib/postgresql/*/bin; install it with "
        f"`apt-get install -y {package}` (or run scripts/ensure_services.sh)"
    )


def wait_until(
    probe: Any,
    *,
    timeout_s: float,
    what: str,
    proc: subprocess.Popen[bytes],
    interval_s: float = 0.02,
) -> None:
    """Poll ``probe`` until true while ``proc`` (the server starting) runs; its exit is a
    failure at once, ``timeout_s`` only bounds a hang."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} while starting")
        if probe():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"{what} did not become ready within {timeout_s} s")


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int, timeout_s: float) -> None:
    """Send ``sig`` and wait for the exit; SIGKILL after ``timeout_s``.  Nothing if gone."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


def wait_for(probe: Any, *, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll ``probe`` until true (a real process must act: a sync, a vote, a gossip)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if probe():
                return
        time.sleep(interval_s)
    raise TimeoutError(f"{what} did not happen within {timeout_s} s")
