"""Running real Ray processes in interop tests: their environment and their cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
from pathlib import Path

import grpc

from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import services as svc
from gcs.testing.hermetic import LEAKED_SETTINGS, isolated_env


def ray_env(root: Path | None) -> dict[str, str]:
    """The environment for ``ray`` commands, nodes and drivers: no PYTHONPATH to our
    checkout, RAY_AUTH_MODE explicitly ``disabled`` (Ray 2.60 would otherwise turn token
    auth on from a ``~/.ray/auth_token``), none of the user's auth/TLS/address settings, and
    with ``root`` a HOME and TMPDIR of their own under it (keep it short: Ray's sockets may
    land under TMPDIR; ``None``: the caller's HOME, for benches run outside the suite).  A
    test that wants auth sets it over this."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if root is None:
        env = {k: v for k, v in base.items() if k not in LEAKED_SETTINGS}
        env["RAY_AUTH_MODE"] = "disabled"
    else:
        env = isolated_env(root, base)
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1")
    return env


def our_env(ray: dict[str, str]) -> dict[str, str]:
    """For our own processes beside Ray's (``gcs serve``, whose ``--head`` starts Ray's
    dashboard and head raylet): this process's environment (our checkout importable) with
    ``ray``'s HOME, TMPDIR and RAY_AUTH_MODE, none of the user's auth/TLS/address settings."""
    env = {k: v for k, v in os.environ.items() if k not in LEAKED_SETTINGS}
    env.update({n: ray[n] for n in ("HOME", "TMPDIR", "RAY_AUTH_MODE") if n in ray})
    return env


def env_prefix(env: dict[str, str]) -> str:
    """``env HOME=... TMPDIR=... RAY_AUTH_MODE=...``: the same isolation for a process
    started from a command line (a provider's start command, split with shlex)."""
    names = [n for n in ("HOME", "TMPDIR", "RAY_AUTH_MODE") if n in env]
    return "env " + " ".join(shlex.quote(f"{n}={env[n]}") for n in names)


async def stop_group(proc: asyncio.subprocess.Process) -> None:
    """Stop a process started with ``start_new_session=True`` and everything it started
    (its process group): SIGTERM, then SIGKILL after 20 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout=20)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


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
