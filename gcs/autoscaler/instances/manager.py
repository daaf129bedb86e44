"""The instance manager: the autoscaler's record of every instance it launched or adopted.

One serialized lane (the project's apply pattern, as ``gcs.managers.lane``): validate the
whole batch against the lifecycle table -> write it once against the storage version ->
apply in memory -> notify subscribers -> reply.  Reads (:attr:`instances`, :meth:`get`)
never wait for a write.  A caller cancelled mid-batch does not cut it in half: the batch
finishes (written, applied, subscribers told) before the lane takes the next one, then the
cancellation goes on.  (``ApplyLane`` itself writes ``WriteBatch``es to a ``Store``; the
instances may live in a GCS's InternalKV instead, and an unknown outcome is resolved here by
re-reading the versioned table, so the lane is this manager's own.)

Deviations from Ray 2.60, on purpose:
- an invalid update is rejected with a log line and a counter (``invalid_updates``), never an
  ``AssertionError`` that would crash the reconcile loop (ray#50868-style crashes);
- after a storage failure whose outcome we cannot know, memory is re-read from storage before
  the next batch, so memory and storage never diverge;
- terminal instances (TERMINATED, ALLOCATION_FAILED) are kept for history up to
  ``retain_terminal`` and then pruned oldest-first in the same batch (Ray keeps them forever).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import structlog

from gcs.autoscaler.instances.model import (
    Instance,
    InstanceUpdate,
    InvalidInstanceUpdate,
    apply_update,
)
from gcs.autoscaler.instances.storage import InstanceStorage, VersionConflict
from gcs.autoscaler.instances.transitions import TERMINAL_STATUSES
from gcs.base.background import shielded
from gcs.base.clock import Clock
from gcs.policy.autoscaling.model import InstanceStatus

__all__ = [
    "InstanceEvent",
    "InstanceManager",
    "InstanceSubscriber",
    "UpdateResult",
    "UpdateStatus",
]

log = structlog.get_logger("gcs.autoscaler.instances")


class UpdateStatus(enum.Enum):
    OK = "OK"
    VERSION_MISMATCH = "VERSION_MISMATCH"
    INVALID_UPDATE = "INVALID_UPDATE"
    STORAGE_ERROR = "STORAGE_ERROR"


@dataclass(frozen=True, slots=True)
class UpdateResult:
    status: UpdateStatus
    version: int
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status is UpdateStatus.OK


@dataclass(frozen=True, slots=True)
class InstanceEvent:
    """One applied update: what was asked, the status before, and the instance after."""

    update: InstanceUpdate
    previous: InstanceStatus | None
    instance: Instance


class InstanceSubscriber(Protocol):
    def notify(self, events: Sequence[InstanceEvent]) -> None:
        """Called after a batch was stored and applied, still inside the lane; must not
        block or await (schedule work instead)."""
        ...


class InstanceManager:
    def __init__(
        self,
        storage: InstanceStorage,
        clock: Clock,
        *,
        subscribers: Sequence[InstanceSubscriber] = (),
        retain_terminal: int = 1000,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._subscribers = tuple(subscribers)
        self._retain_terminal = retain_terminal
        self._lane = asyncio.Lock()
        self._instances: dict[str, Instance] = {}
        self._version = 0
        self._loaded = False
        self.invalid_updates = 0
        self.version_mismatches = 0
        self.storage_failures = 0

    # -- reads (never wait for the lane) --------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @property
    def instances(self) -> Mapping[str, Instance]:
        return MappingProxyType(self._instances)

    def get(self, instance_id: str) -> Instance | None:
        return self._instances.get(instance_id)

    # -- lifecycle ------------------------------------------------------------------------
    async def load(self) -> None:
        async with self._lane:
            await self._reload()

    async def ensure_loaded(self) -> None:
        """Load (or re-load after a storage failure) unless memory is current."""
        if not self._loaded:
            async with self._lane:
                if not self._loaded:
                    await self._reload()

    async def _reload(self) -> None:
        version, instances = await self._storage.load()
        self._version, self._instances, self._loaded = version, instances, True
        log.info("instances.loaded", version=version, instances=len(instances))

    # -- the write lane ---------------------------------------------------------------------
    async def update(
        self, updates: Sequence[InstanceUpdate], *, expected_version: int | None = None
    ) -> UpdateResult:
        """Apply ``updates`` as one batch.  ``expected_version`` None skips the check."""
        async with self._lane:  # finished under the lane even if the caller is cancelled
            return await shielded(self._apply_batch(updates, expected_version))

    async def _apply_batch(
        self, updates: Sequence[InstanceUpdate], expected_version: int | None
    ) -> UpdateResult:
        """validate -> write -> apply -> notify; called holding the lane."""
        if not self._loaded:
            await self._reload()
        if expected_version is not None and expected_version != self._version:
            self.version_mismatches += 1
            return UpdateResult(
                UpdateStatus.VERSION_MISMATCH,
                self._version,
                f"expected version {expected_version}, current {self._version}",
            )
        if not updates:
            return UpdateResult(UpdateStatus.OK, self._version)
        now_ns = int(self._clock.now_s() * 1e9)
        working: dict[str, Instance] = {}
        events: list[InstanceEvent] = []
        try:
            for upd in updates:
                current = working.get(upd.instance_id) or self._instances.get(upd.instance_id)
                after = apply_update(current, upd, now_ns)
                working[upd.instance_id] = after
                events.append(InstanceEvent(upd, current.status if current else None, after))
        except InvalidInstanceUpdate as err:
            self.invalid_updates += 1
            log.warning("instances.invalid_update", error=err.message)
            return UpdateResult(UpdateStatus.INVALID_UPDATE, self._version, err.message)
        deletes = self._prune_terminal(working)
        try:
            new_version = await self._storage.write(self._version, list(working.values()), deletes)
        except VersionConflict as err:
            self.version_mismatches += 1
            log.warning("instances.version_conflict", error=str(err))
            await self._reload()
            return UpdateResult(UpdateStatus.VERSION_MISMATCH, self._version, str(err))
        except Exception as err:  # any storage failure: outcome unknown, re-read later
            self.storage_failures += 1
            self._loaded = False
            log.warning("instances.storage_failed", error=repr(err))
            return UpdateResult(UpdateStatus.STORAGE_ERROR, self._version, repr(err))
        self._instances.update(working)
        for iid in deletes:
            self._instances.pop(iid, None)
        self._version = new_version
        for sub in self._subscribers:
            try:
                sub.notify(events)
            except Exception:  # a subscriber's bug must not undo a stored batch
                log.exception("instances.subscriber_failed", subscriber=type(sub).__name__)
        return UpdateResult(UpdateStatus.OK, new_version)

    def _prune_terminal(self, working: Mapping[str, Instance]) -> list[str]:
        merged = {**self._instances, **working}
        terminal = [i for i in merged.values() if i.status in TERMINAL_STATUSES]
        excess = len(terminal) - self._retain_terminal
        if excess <= 0:
            return []
        terminal.sort(key=lambda i: (i.history[-1].time_ns if i.history else 0, i.instance_id))
        return [i.instance_id for i in terminal[:excess] if i.instance_id not in working]
