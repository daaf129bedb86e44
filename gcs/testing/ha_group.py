"""Members of a ``gcs serve --ha`` group as real processes on one port, and a KV client
over gRPC for linearizability histories (process tests and ``bench/ha``).

Every member is started with the tree under test (``python -m gcs`` from the current
working directory); its JSON log lines are read back to see its role.  Every process
started here is stopped by pid (:meth:`HaMember.stop`, :meth:`HaGroup.stop`).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.rpc.interceptors import NOT_LEADER_MESSAGE

__all__ = ["GrpcKv", "HaGroup", "HaMember", "KvRefused", "definitely_failed"]

FAST_RECONNECT = (
    # a takeover's first answered call must not wait for gRPC's default 1 s+ backoff
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 100),
    # a channel of its own: gRPC otherwise shares one connection among channels to the same
    # address, and a new client would ride an old connection to a paused ex-leader
    ("grpc.use_local_subchannel_pool", 1),
)


@dataclass
class HaMember:
    name: str
    storage: str
    port: int
    namespace: str
    log_path: pathlib.Path
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> HaMember:
        args = [
            sys.executable, "-m", "gcs", "serve", "--ha",
            "--port", str(self.port),
            "--storage", self.storage,
            "--namespace", self.namespace,
            "--metrics-port", "-1",
            "--log-format", "json",
            *self.extra_args,
        ]  # fmt: skip
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        finally:
            log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """This member's log lines (JSON), those named ``name`` if given."""
        out = []
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        for line in lines:
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if name is None or event.get("event") == name:
                out.append(event)
        return out

    def count(self, name: str) -> int:
        return len(self.events(name))

    def wait_for(self, name: str, *, count: int = 1, timeout_s: float = 60.0) -> dict[str, Any]:
        """Until the member logged ``name`` ``count`` times (the deadline bounds a hang: a
        Python start takes seconds on a loaded machine; an exit is seen at once)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.events(name)
            if len(found) >= count:
                return found[count - 1]
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            time.sleep(0.02)
        raise TimeoutError(f"{self.name} did not log {name} x{count} within {timeout_s} s")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(10)

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused member must see the SIGTERM
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class HaGroup:
    """Members sharing one address and one store namespace."""

    storage: str
    port: int
    directory: pathlib.Path
    namespace: str = field(default_factory=lambda: f"ha-{uuid.uuid4().hex[:8]}")
    extra_args: tuple[str, ...] = ()
    members: list[HaMember] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def add(self, name: str, env: dict[str, str] | None = None) -> HaMember:
        """Start member ``name`` (``env``: more environment, e.g. ``GCS_HA_LEASE_TTL_MS``)."""
        member = HaMember(
            name,
            self.storage,
            self.port,
            self.namespace,
            self.directory / f"{name}.log",
            self.extra_args,
            # the members' lock files (same-host death detection) under the test's directory
            {"GCS_HA_LOCK_DIR": str(self.directory / "ha-locks"), **(env or {})},
        )
        self.members.append(member)
        return member.start()

    def leaders(self) -> list[HaMember]:
        """Members whose last role event says leader (and that are alive)."""
        out = []
        for member in self.members:
            if member.proc is None or member.proc.poll() is not None:
                continue
            roles = [e["event"] for e in member.events() if e.get("event") in _ROLE_EVENTS]
            if roles and roles[-1] == "ha.leader":
                out.append(member)
        return out

    def stop(self) -> None:
        for member in self.members:
            member.stop()


_ROLE_EVENTS = ("ha.leader", "ha.step_down", "ha.standby")


class KvRefused(Exception):
    """The GCS answered the KV call with an error status in the reply."""


def definitely_failed(err: BaseException) -> bool:
    """Errors after which the operation certainly did not take effect: refused by an
    ex-leader's per-call check or its fenced store ("nothing was written"), or never sent
    (no connection)."""
    if isinstance(err, KvRefused):
        return "nothing was written" in str(err)
    if isinstance(err, grpc.aio.AioRpcError):
        details = err.details() or ""
        if err.code() == grpc.StatusCode.UNAVAILABLE and (
            NOT_LEADER_MESSAGE in details
            or "nothing was written" in details
            or "failed to connect" in details.lower()
        ):
            return True
    return False


class GrpcKv:
    """InternalKV over gRPC (:class:`gcs.testing.linearizability.KvClient`), one channel
    to the group's address that reconnects fast."""

    def __init__(self, address: str, *, timeout_s: float = 5.0) -> None:
        self.channel = grpc.aio.insecure_channel(address, options=FAST_RECONNECT)
        self._timeout_s = timeout_s
        self._stub = ServiceStub(self.channel, svc.INTERNAL_KV, timeout_s=timeout_s)

    async def put(self, namespace: bytes, key: bytes, value: bytes, *, overwrite: bool) -> bool:
        reply = await self._stub.InternalKVPut(
            G.InternalKVPutRequest(namespace=namespace, key=key, value=value, overwrite=overwrite)
        )
        _check(reply)
        return bool(reply.added)

    async def get(self, namespace: bytes, key: bytes) -> bytes | None:
        reply = await self._stub.InternalKVGet(G.InternalKVGetRequest(namespace=namespace, key=key))
        if reply.status.code == 17:  # Ray's NotFound
            return None
        _check(reply)
        return bytes(reply.value)

    async def delete(self, namespace: bytes, key: bytes, *, by_prefix: bool) -> int:
        reply = await self._stub.InternalKVDel(
            G.InternalKVDelRequest(namespace=namespace, key=key, del_by_prefix=by_prefix)
        )
        _check(reply)
        return int(reply.deleted_num)

    async def close(self) -> None:
        await self.channel.close()


def _check(reply: Any) -> None:
    if reply.status.code != 0:
        raise KvRefused(f"{reply.status.code}: {reply.status.message}")


Predicate = Callable[[], bool]
