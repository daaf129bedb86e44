"""After a restart, reach the raylets known from the store: spread, bounded, on the clock.

``load()`` (nodes loaded): every alive node gets a time in a window sized by the contact
rate (:mod:`gcs.managers.startup_spread`); the load poller's first poll of each node waits
for its time.  ``run()`` (once the GCS serves: the raylets call back): each raylet is told
``NotifyGCSRestart`` at its time in a window of its own that starts then (not a burst of
those whose time passed while the GCS loaded), a bounded number at once, then asked
to release the actor workers no live actor uses.  A notification task exists only once it
has a slot.  A fresh cluster has no alive node and does nothing.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import structlog

from gcs.base.background import Background
from gcs.base.clock import Clock
from gcs.base.errors import GcsError
from gcs.managers.actors import ActorManager
from gcs.managers.load_poller import LoadPoller
from gcs.managers.nodes import NodeManager
from gcs.managers.startup_spread import spread, spread_lazily, spread_window_s
from gcs.rpc.raylet_io.gateway import RayletGateway, raylet_address

log = structlog.get_logger("gcs.restart")

NOTIFY_TIMEOUT_S = 5.0
_FAILURES_SHOWN = 5


class RestartNotice:
    name = "restart_notice"

    def __init__(
        self,
        nodes: NodeManager,
        poller: LoadPoller,
        raylets: RayletGateway,
        actors: ActorManager,
        clock: Clock,
        *,
        contacts_per_s: int,
        max_concurrent: int,
        serving: Callable[[], Awaitable[object]],
        rng: random.Random | None = None,
    ) -> None:
        """``serving``: returns once the GCS port accepts calls."""
        self._nodes = nodes
        self._poller = poller
        self._raylets = raylets
        self._actors = actors
        self._clock = clock
        self._contacts_per_s = contacts_per_s
        self._max_concurrent = max_concurrent
        self._serving = serving
        self._rng = rng or random.Random()
        self._to_notify: list[bytes] = []
        self._window_s = 0.0
        self._notifications = Background("restart_notice")
        self.notified = 0
        self._failed: dict[bytes, str] = {}
        """Raylets that did not take the notice (node id -> error), for the one summary."""

    async def load(self) -> None:
        alive = self._nodes.alive
        if not alive:
            return
        window_s = spread_window_s(len(alive), self._contacts_per_s)
        now = self._clock.monotonic_s()
        self._poller.spread_first_polls(spread(alive, now, window_s, self._rng))
        self._to_notify, self._window_s = list(alive), window_s  # spread from serving on

    async def run(self) -> None:
        if not self._to_notify:
            return
        await self._serving()
        start = self._clock.monotonic_s()
        slots = asyncio.Semaphore(self._max_concurrent)
        for node_id, at in spread_lazily(self._to_notify, self._window_s, self._rng):
            delay = start + at - self._clock.monotonic_s()
            if delay > 0.001:
                await self._clock.sleep(delay)
            node = self._nodes.alive.get(node_id)
            if node is None:
                continue
            await slots.acquire()
            self._notifications.spawn(self._notify(node_id, raylet_address(node), slots), "one")
        await self._notifications.settle()
        # one line for the whole fleet (10,000 raylets were 10,000 info lines); each
        # raylet's own outcome is at debug level
        log.info(
            "raylet.restart_notices",
            notified=self.notified - len(self._failed),
            failed=len(self._failed),
            first_failures={n.hex(): e for n, e in list(self._failed.items())[:_FAILURES_SHOWN]},
        )

    async def _notify(self, node_id: bytes, address: str, slots: asyncio.Semaphore) -> None:
        try:
            try:
                await self._raylets.notify_gcs_restart(node_id, address, NOTIFY_TIMEOUT_S)
            except GcsError as err:
                self._failed[node_id] = err.message
                log.debug("raylet.notify_failed", node_id=node_id.hex(), error=err.message)
            else:
                log.debug("raylet.notified_restart", node_id=node_id.hex())
            self.notified += 1
            node = self._nodes.alive.get(node_id)
            if node is not None:
                await self._actors.release_unused_workers(node)
        finally:
            slots.release()

    async def close(self) -> None:
        await self._notifications.close()
