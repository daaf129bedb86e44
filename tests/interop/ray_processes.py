"""Running real Ray processes in interop tests: their environment and their cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
from collections.abc import Sequence
from pathlib import Path

import grpc

from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.server.head_processes import AdoptedProcess
from gcs.testing.hermetic import LEAKED_SETTINGS, isolated_env

RAY_TIMERS = {
    # Ray's 10 s for a raylet to come up is short on 2 loaded cores (seen at load 27)
    "RAY_raylet_start_wait_time_s": "120",
    # On SIGTERM `ray start --block` first drains its node through the GCS and waits up to
    # 30 s for the raylet to leave (up to the drain's 30 s RPC timeout when the GCS is gone):
    # tests stop every node at the end, there is nothing to drain.
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
}
"""Ray's timers for every Ray process a test starts (our GCS's children too)."""
NO_LOG_MONITOR = "--include-log-monitor=false"
"""For a ``ray start`` whose node need not stream its workers' output to drivers (Ray's log
monitor: a Python process polling the node's log files every 0.1 s and publishing them on
the GCS's log channel): no test reads worker output through a driver, and it costs ~0.5 CPU
s to start and ~0.5 CPU s a minute per node."""
_CARRIED = ("HOME", "TMPDIR", "RAY_AUTH_MODE", *RAY_TIMERS)
"""What a Ray environment hands on to processes started beside it or from a command line."""


def ray_env(root: Path | None) -> dict[str, str]:
    """The environment for ``ray`` commands, nodes and drivers: no PYTHONPATH to our
    checkout, RAY_AUTH_MODE explicitly ``disabled`` (Ray 2.60 would otherwise turn token
    auth on from a ``~/.ray/auth_token``), none of the user's auth/TLS/address settings,
    :data:`RAY_TIMERS`, and with ``root`` a HOME and TMPDIR of their own under it (keep it
    short: Ray's sockets may land under TMPDIR; ``None``: the caller's HOME, for benches run
    outside the suite).  A test that wants auth sets it over this."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if root is None:
        env = {k: v for k, v in base.items() if k not in LEAKED_SETTINGS}
        env["RAY_AUTH_MODE"] = "disabled"
    else:
        env = isolated_env(root, base)
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1", **RAY_TIMERS)
    return env


def our_env(ray: dict[str, str]) -> dict[str, str]:
    """For our own processes beside Ray's (``gcs serve``, whose ``--head`` starts Ray's
    dashboard and head raylet): this process's environment (our checkout importable) with
    ``ray``'s HOME, TMPDIR, RAY_AUTH_MODE and Ray timers, none of the user's auth/TLS/address
    settings."""
    env = {k: v for k, v in os.environ.items() if k not in LEAKED_SETTINGS}
    env.update({n: ray[n] for n in _CARRIED if n in ray})
    return env


def env_prefix(env: dict[str, str]) -> str:
    """``env HOME=... TMPDIR=... RAY_AUTH_MODE=... RAY_...``: the same isolation and timers
    for a process started from a command line (a provider's start command, split with
    shlex)."""
    return "env " + " ".join(shlex.quote(f"{n}={env[n]}") for n in _CARRIED if n in env)


STOP_GRACE_S = 20.0
"""SIGTERM to SIGKILL for the process groups a test stops together."""


async def stop_groups(procs: Sequence[asyncio.subprocess.Process]) -> None:
    """Stop processes started with ``start_new_session=True`` and everything they started
    (their process groups): SIGTERM to every group at once, then SIGKILL to what is left of
    each once its leader exited or after :data:`STOP_GRACE_S` (one wait for all of them)."""

    async def stop(proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()

    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    await asyncio.gather(*(stop(proc) for proc in procs))


async def stop_group(proc: asyncio.subprocess.Process) -> None:
    """:func:`stop_groups` of one."""
    await stop_groups([proc])


async def process_exit(pid: int, timeout_s: float) -> None:
    """Until process ``pid`` (a Ray worker: not our child, so no ``wait``) has exited, zombie
    or reaped: its pidfd turns readable then (what our GCS waits on for an adopted child)."""
    await asyncio.wait_for(AdoptedProcess(pid).wait(), timeout_s)


async def set_full_python_version(address: str, ray_python: str) -> None:
    """``CLUSTER_METADATA`` with the interpreter's full version (Ray compares it), until our
    head sets it itself (issue 10); a no-op when it already matches."""
    probe = await asyncio.create_subprocess_exec(
        ray_python, "-c", "import platform; print(platform.python_version())",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    version = (await probe.communicate())[0].decode().strip()
    async with grpc.aio.insecure_channel(address) as channel:
        cluster_id = (
            await ServiceStub(channel, svc.NODE_INFO).GetClusterId(G.GetClusterIdRequest())
        ).cluster_id
        kv = ServiceStub(channel, svc.INTERNAL_KV, metadata=[("ray_cluster_id", cluster_id.hex())])
        key = G.InternalKVGetRequest(namespace=b"cluster", key=b"CLUSTER_METADATA")
        meta = json.loads((await kv.InternalKVGet(key)).value)
        if not version or meta.get("python_version") == version:
            return
        meta["python_version"] = version
        await kv.InternalKVPut(
            G.InternalKVPutRequest(
                namespace=b"cluster",
                key=b"CLUSTER_METADATA",
                value=json.dumps(meta).encode(),
                overwrite=True,
            )
        )
