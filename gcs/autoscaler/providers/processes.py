"""Local processes a provider started, remembered on disk so a restarted autoscaler finds
them again (and never launches a request id twice).

Layout under ``state_dir``: ``instances/<cloud id>.json`` (pid, node type, kind, request
id, start time) and ``requests/<request id>`` (a launch or terminate already done).  A record
whose process is gone is a terminated instance.  Every process runs in its own session, so
terminating kills its whole process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from gcs.autoscaler.providers.base import CloudInstance
from gcs.base.clock import Clock, within
from gcs.base.processes import pid_alive
from gcs.policy.autoscaling.model import NodeKind

log = structlog.get_logger("gcs.autoscaler.providers")


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    cloud_instance_id: str
    node_type: str
    kind: str
    request_id: str
    pid: int
    started_s: float
    log_path: str


class ProcessRecords:
    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir)
        self._instances = self.root / "instances"
        self._requests = self.root / "requests"
        self.logs = self.root / "logs"
        for d in (self._instances, self._requests, self.logs):
            d.mkdir(parents=True, exist_ok=True)

    def seen_request(self, request_id: str) -> bool:
        return (self._requests / _safe(request_id)).exists()

    def mark_request(self, request_id: str) -> None:
        (self._requests / _safe(request_id)).touch()

    def save(self, record: ProcessRecord) -> None:
        tmp = self._instances / f".{record.cloud_instance_id}.tmp"
        tmp.write_text(json.dumps(asdict(record)))
        tmp.replace(self._instances / f"{record.cloud_instance_id}.json")

    def forget(self, cloud_instance_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self._instances / f"{_safe(cloud_instance_id)}.json").unlink()

    def load(self) -> dict[str, ProcessRecord]:
        out = {}
        for path in sorted(self._instances.glob("*.json")):
            try:
                rec = ProcessRecord(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as err:
                log.warning("provider.bad_record", path=str(path), error=str(err))
                continue
            out[rec.cloud_instance_id] = rec
        return out

    def non_terminated(self) -> Mapping[str, CloudInstance]:
        """Instances whose process runs (a read: records of gone ones stay until
        :meth:`prune`).  ``OSError`` if the records cannot be read."""
        return {
            cid: CloudInstance(cid, rec.node_type, NodeKind(rec.kind), True, rec.request_id)
            for cid, rec in self.load().items()
            if self.running(rec)
        }

    @staticmethod
    def running(rec: ProcessRecord) -> bool:
        """Its process runs; pid 0 is a daemonized start, tracked by its record alone."""
        return rec.pid == 0 or pid_alive(rec.pid)

    def prune(self) -> None:
        """Forget records whose process is gone (written before new launches, never while
        listing)."""
        for cid, rec in self.load().items():
            if not self.running(rec):
                self.forget(cid)


async def spawn_logged(
    argv: Sequence[str], log_path: Path, env: Mapping[str, str]
) -> asyncio.subprocess.Process:
    """Start ``argv`` in its own session (so :func:`kill_group` stops all it started), with
    stdout and stderr appended to ``log_path``."""
    out = await asyncio.to_thread(log_path.open, "ab")
    with out:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=dict(env),
        )


async def kill_group(pid: int, clock: Clock, *, grace_s: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left once ``grace_s`` of
    ``clock``'s time passed without the leader exiting."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    if not pid_alive(pid):
        return
    try:
        await within(clock, grace_s, _exited(pid))
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


async def _exited(pid: int) -> None:
    """Until process ``pid`` has exited.  A process we may not be the parent of (one adopted
    from the records) offers nothing to wait on but its pidfd, which turns readable when it
    exits: no polling, no sleep."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(fd, readable)
    try:
        if pid_alive(pid):  # it may have exited (a zombie) before the reader was added
            await gone
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def terminate_records(records: ProcessRecords, ids: Sequence[str], clock: Clock) -> None:
    known = records.load()
    for cid in ids:
        rec = known.get(cid)
        if rec is not None:
            await kill_group(rec.pid, clock)
        records.forget(cid)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:200]
