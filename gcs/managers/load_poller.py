"""Load polling: ``NodeManagerService.GetResourceLoad`` on every alive raylet, into the
:class:`~gcs.managers.resources.ResourceCache`.

``LoadPoller`` calls every alive raylet each period
(Ray default 1 s) through the raylet gateway, with a per-call deadline and a concurrency bound
(a poll task exists only once it has a slot).  A node whose previous poll is still in flight
is skipped for the round, so a slow or dead raylet never delays the rest, and one whose polls
keep failing is polled less often (1, 2, 4, ... periods apart, capped).  With adaptive
polling on, a raylet whose syncer view did not change since its last poll is polled at most
every ``syncer_max_staleness_ms`` instead of every period.  After a restart the
first polls of nodes known from the store are spread over a window
(:func:`gcs.managers.startup_spread.spread`).  ``SlicedApplier`` applies the replies in
slices of the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from gcs.base.background import Background
from gcs.base.clock import Clock
from gcs.base.errors import GcsError
from gcs.config import LoadPollConfig
from gcs.managers.nodes import NodeManager
from gcs.managers.resources import ResourceCache
from gcs.proto import gcs_pb2
from gcs.rpc.raylet_io.gateway import RayletGateway

log = structlog.get_logger("gcs.resources")

_DISPATCH_SLICE = 2000
"""Nodes looked at per event-loop slice while starting a poll round."""


class SlicedApplier:
    """Applies poll replies to the cache at most ``slice_size`` per event-loop turn.

    A poll round's replies arrive in bursts (hundreds per ``select``); applying each one in
    its own task's wake-up would run them all in one loop iteration and hold every other
    request (``GetClusterResourceState`` among them) for tens of milliseconds.  Replies are
    queued instead and one drain task applies a slice, yields to the loop, and goes on.
    """

    def __init__(
        self,
        cache: ResourceCache,
        slice_size: int,
        on_report: Callable[[bytes], None] | None = None,
    ) -> None:
        if slice_size < 1:
            raise ValueError(f"load_poll.slice_size must be >= 1, got {slice_size}")
        self._cache = cache
        self._slice = slice_size
        self._on_report = on_report
        self._pending: collections.deque[tuple[bytes, gcs_pb2.ResourcesData]] = collections.deque()
        self._drain: asyncio.Task[None] | None = None
        self._tasks = Background("load_applier")

    def __len__(self) -> int:
        return len(self._pending)

    def submit(self, node_id: bytes, data: gcs_pb2.ResourcesData) -> None:
        self._pending.append((node_id, data))
        if self._drain is None:
            self._drain = self._tasks.start(self._run(), "drain")

    async def flush(self) -> None:
        """Return once every reply submitted so far has been applied."""
        while self._drain is not None:
            await asyncio.shield(self._drain)

    async def close(self) -> None:
        await self._tasks.close()

    async def _run(self) -> None:
        pending, apply, on_report = self._pending, self._cache.apply, self._on_report
        try:
            while pending:
                for _ in range(min(self._slice, len(pending))):
                    node_id, data = pending.popleft()
                    if apply(node_id, data) and on_report is not None:
                        on_report(node_id)
                if pending:
                    await asyncio.sleep(0)
        finally:
            self._drain = None


@dataclass(slots=True)
class PollStats:
    rounds: int = 0
    polls_ok: int = 0
    polls_failed: int = 0
    skipped_in_flight: int = 0
    skipped_synced: int = 0
    """Polls left out because the node's syncer view was unchanged (adaptive polling)."""
    last_round_s: float = 0.0
    """Wall time from round start until its last reply (or deadline)."""
    max_staleness_s: float = 0.0


class LoadPoller:
    def __init__(
        self,
        nodes: NodeManager,
        cache: ResourceCache,
        raylets: RayletGateway,
        clock: Clock,
        config: LoadPollConfig,
        *,
        on_report: Callable[[bytes], None] | None = None,
        view_version: Callable[[bytes], int | None] | None = None,
    ) -> None:
        """``view_version``: the version of a node's syncer view while its stream is up
        (None otherwise); with ``config.syncer_max_staleness_ms`` it drives adaptive
        polling."""
        self._nodes = nodes
        self._view_version = view_version
        self._synced_s = config.syncer_max_staleness_ms / 1000
        self._polled_view: dict[bytes, tuple[int, float]] = {}
        """Node -> (syncer view version, monotonic time) of its last successful poll."""
        self._cache = cache
        self._raylets = raylets
        self._clock = clock
        self._config = config
        self._timeout_s = config.timeout_ms / 1000
        self._period_s = config.period_ms / 1000
        self._backoff_max_s = config.failure_backoff_max_ms / 1000
        self._applier = SlicedApplier(cache, config.slice_size, on_report)
        self._polls = Background("load_poller")
        """Each poll of a round: one task per node (cancelled with its round)."""
        self._rounds = Background("load_poller:rounds")
        """Rounds awaiting their stragglers while the next one starts."""
        self._in_flight: set[bytes] = set()
        self._sem = asyncio.Semaphore(config.max_concurrent)
        self._failures: dict[bytes, int] = {}
        self._not_before: dict[bytes, float] = {}
        """Nodes not to poll before a (monotonic) time: first polls spread after a restart,
        and raylets whose polls keep failing (backoff)."""
        self.stats = PollStats()

    @property
    def settled(self) -> bool:
        """No poll awaits its reply and every reply received is applied.  Rounds overlap (a
        round starts every period without waiting for stragglers), so a later round that
        skipped a node still in flight can finish before that node's reply is applied."""
        return not self._in_flight and not len(self._applier)

    def spread_first_polls(self, due: dict[bytes, float]) -> None:
        """Poll each node no earlier than its (monotonic) time (see ``startup_spread``)."""
        self._not_before.update(due)

    async def poll_once(self) -> None:
        """One round: poll every due alive node not still busy, and wait for the replies
        (applied in slices by the ``SlicedApplier``)."""
        started = time.monotonic()
        await self._finish_round(started, await self._dispatch())

    async def _dispatch(self) -> list[asyncio.Task[None]]:
        """Start this round's polls; returns once the last one has a slot (not a reply).

        Polls start ``slice_size`` at a time, the slices spread evenly over ``spread`` of the
        period (each start writes to a socket and replies come back about as they were sent),
        so a round of thousands never holds the loop in one iteration.  A node whose polls
        keep failing is skipped until its backoff (``not_before``) has passed.
        """
        tasks: list[asyncio.Task[None]] = []
        not_before = self._not_before
        slice_size = self._config.slice_size
        pause_s = self._config.spread * self._period_s * slice_size / max(len(self._nodes.alive), 1)
        now = self._clock.monotonic_s()
        try:
            for i, node_id in enumerate(list(self._nodes.alive)):
                if i % _DISPATCH_SLICE == _DISPATCH_SLICE - 1:
                    await asyncio.sleep(0)  # 50,000 nodes: never hold the loop for a whole pass
                    now = self._clock.monotonic_s()
                if node_id in self._in_flight:
                    self.stats.skipped_in_flight += 1
                    continue
                version = self._view_version(node_id) if self._view_version else None
                if (
                    version is not None
                    and self._synced_s > 0
                    and self._may_skip(node_id, version, now)
                ):
                    self.stats.skipped_synced += 1
                    continue
                if not_before:
                    due = not_before.get(node_id)
                    if due is not None:
                        if due > now:
                            continue
                        del not_before[node_id]
                await self._sem.acquire()
                node = self._nodes.alive.get(node_id)  # re-read: the loop ran meanwhile
                if node is None:  # died while we waited
                    self._sem.release()
                    continue
                self._in_flight.add(node_id)
                address = f"{node.node_manager_address}:{node.node_manager_port}"
                tasks.append(self._polls.start(self._poll(node_id, address, version), "poll"))
                if len(tasks) % slice_size == 0:
                    await self._clock.sleep(pause_s)  # pacing of socket writes in a round
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        alive = self._nodes.alive
        for table in (self._not_before, self._failures, self._polled_view):
            if len(table) > len(alive):  # entries of dead nodes
                for dead in [n for n in table if n not in alive]:
                    del table[dead]
        return tasks

    def _may_skip(self, node_id: bytes, version: int, now: float) -> bool:
        """Adaptive polling: skip a node whose syncer view is the one of its last poll, whose
        last poll showed no pending demand, and whose last poll is younger than the bound.

        The syncer carries resources, idle and draining but not the load: a queued task that
        changes no resource (infeasible, or waiting on a full node) shows only in a poll.  So
        a node with pending demand is polled every round (its queue moves without its view
        moving), and a quiet one at least every ``syncer_max_staleness_ms``: new demand on a
        node whose view did not change reaches the autoscaler at most that late.  Polls are
        due at round boundaries, so the age is compared with half a period of slack (a reply
        lands a little after its round started).
        """
        polled = self._polled_view.get(node_id)
        if polled is None or polled[0] != version:
            return False
        if now - polled[1] >= self._synced_s - self._period_s / 2:
            return False
        entry = self._cache.nodes.get(node_id)
        return entry is not None and not entry.demand

    async def _finish_round(self, started: float, tasks: list[asyncio.Task[None]]) -> None:
        try:
            if tasks:
                await asyncio.gather(*tasks)
            await self._applier.flush()
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        self.stats.rounds += 1
        self.stats.last_round_s = time.monotonic() - started
        now = self._clock.monotonic_s()
        self.stats.max_staleness_s = max(
            (now - e.updated_mono_s for e in self._cache.nodes.values()), default=0.0
        )

    async def _poll(self, node_id: bytes, address: str, view_version: int | None) -> None:
        try:
            data = await self._raylets.get_resource_load(node_id, address, self._timeout_s)
        except GcsError as err:
            self.stats.polls_failed += 1
            count = self._failures.get(node_id, 0) + 1
            self._failures[node_id] = count
            gap_s = min(self._period_s * (1 << min(count - 1, 30)), self._backoff_max_s)
            if gap_s > self._period_s:
                self._not_before[node_id] = self._clock.monotonic_s() + gap_s
            if count % 10 == 1:  # Ray logs every 10th failure
                log.warning(
                    "load_poll.failed", node_id=node_id.hex(), error=err.message, failures=count
                )
            return
        finally:
            self._in_flight.discard(node_id)
            self._sem.release()
        self._failures.pop(node_id, None)
        if view_version is not None:
            self._polled_view[node_id] = (view_version, self._clock.monotonic_s())
        self.stats.polls_ok += 1
        self._applier.submit(node_id, data)

    async def run(self) -> None:
        """Start a round every period (of the injected clock) without waiting for stragglers
        of the last one.

        A round's polls are started one slot at a time; the next round begins only after
        the last poll of this one started, so rounds never compete for slots.
        """
        period_s = self._config.period_ms / 1000
        clock = self._clock
        loop = asyncio.get_running_loop()
        if period_s == 0:  # Ray's meaning of a zero period: no load pull at all
            log.info("load_poll.off", reason="gcs_pull_resource_loads_period_milliseconds=0")
            await loop.create_future()  # until cancelled
        try:
            while True:
                begin = clock.monotonic_s()
                started = time.monotonic()  # the round's wall time is a figure (stats)
                self._rounds.start(self._finish_round(started, await self._dispatch()), "round")
                await clock.sleep(max(0.0, period_s - (clock.monotonic_s() - begin)))
        finally:
            await self._rounds.close()
            await self._polls.close()
            await self._applier.close()
