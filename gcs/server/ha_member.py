"""What ``GcsServer`` runs with ``--ha`` instead of one wiring for the whole run: the
member's lease loop (``gcs.server.ha``), its status port, and each leader term — a fresh
wiring loaded from the standby's mirror, run until the lease is lost."""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import Callable

from gcs.base.clock import Clock
from gcs.base.ha_keys import HA_LEADER_KEY, HA_NAMESPACE
from gcs.base.lifecycle import ComponentFailed, Supervisor, start_until_ready
from gcs.config import GcsConfig
from gcs.managers.cluster_meta import stored_cluster_id
from gcs.managers.kv import encode_key
from gcs.server.gc_policy import freeze_start_heap
from gcs.server.ha import HaCoordinator, HaSettings, StartTerm
from gcs.server.ha_lock import LockDir, default_lock_dir
from gcs.server.ha_mirror import TakeoverStore
from gcs.server.ha_status import HaStatusServer
from gcs.server.metrics import GcsMetrics
from gcs.server.wiring import Wiring
from gcs.store import Store
from gcs.store.base import TABLE_KV
from gcs.store.ha import Change

LEADER_RECORD_KEY = encode_key(HA_NAMESPACE, HA_LEADER_KEY)
"""Where InternalKV stores the leader record (``start_leader_term``)."""
STEP_DOWN_GRACE_S = 0.1
"""How long a stepping-down term lets its open calls finish (they fail fast: the term's
store is cut) before it closes every connection."""


class LeaderTerm:
    """One running HA term (:class:`gcs.server.ha.Term`)."""

    def __init__(
        self,
        wiring: Wiring,
        supervisor: Supervisor,
        running: asyncio.Task[None],
        *,
        on_stopped: Callable[[Wiring], None],
    ) -> None:
        self.wiring = wiring
        self._supervisor = supervisor
        self._running = running
        self._on_stopped = on_stopped
        self.steps: dict[str, float] = {}
        """When its start's steps happened (``gcs.server.ha_steps``)."""

    async def wait(self) -> None:
        try:
            await asyncio.shield(self._running)
        except ComponentFailed as failed:
            raise failed.cause from None

    # a planned handover (gcs.server.ha_handover.HandoverTerm)
    def hold(self) -> None:
        self.wiring.rpc.hold()

    async def quiesce(self, bound_s: float) -> int:
        return await self.wiring.rpc.quiesce(bound_s)

    def hand_off(self) -> int:
        return self.wiring.rpc.hand_off()

    async def leader_record(self) -> bytes | None:
        """What the group's leader recorded in InternalKV (``start_leader_term``), as stored."""
        return await self.wiring.managers.kv.get(HA_NAMESPACE, HA_LEADER_KEY)

    def recorded_in(self, change: Change) -> bytes | None:
        """The leader record's new value if ``change`` (from the change stream) writes it."""
        if change.table == TABLE_KV and change.key == LEADER_RECORD_KEY:
            return change.value
        return None

    async def stop(self) -> None:
        # not the leader any more: only the answers already due (the calls the cut store
        # failed, issue 29 item 2) are let out before the connections close
        self.wiring.rpc.grace_s = STEP_DOWN_GRACE_S
        self._supervisor.stop()
        await asyncio.gather(self._running, return_exceptions=True)
        await self._supervisor.close()
        self._on_stopped(self.wiring)


async def start_leader_term(
    wiring: Wiring,
    store: TakeoverStore,
    leader: dict[str, object],
    *,
    on_serving: Callable[[Wiring], None],
    on_stopped: Callable[[Wiring], None],
) -> LeaderTerm:
    """Load ``wiring`` (from the standby's mirror), run it; returns once the shared port
    serves and ``leader`` is recorded in InternalKV for ``gcs status``."""
    supervisor = Supervisor(wiring.components)
    steps = wiring.rpc.steps
    steps.mark("built")
    try:
        await supervisor.load()
    except ComponentFailed as failed:
        raise failed.cause from None
    steps.mark("loaded")
    store.release_mirror()
    running = await start_until_ready(supervisor.run(), wiring.rpc.serving(), name="gcs-term")
    term = LeaderTerm(wiring, supervisor, running, on_stopped=on_stopped)
    if not wiring.rpc.is_serving:
        failure = running.exception() if running.done() else None
        await term.stop()
        if isinstance(failure, ComponentFailed):
            raise failure.cause
        raise RuntimeError("the GCS term stopped before it served")
    on_serving(wiring)
    try:  # `gcs status` shows who leads (a fenced write here ends the term)
        await wiring.managers.kv.put(
            HA_NAMESPACE, HA_LEADER_KEY, json.dumps(leader).encode(), overwrite=True
        )
    except BaseException:
        await term.stop()
        raise
    steps.mark("recorded")
    term.steps = steps.at
    return term


async def holder_locks(config: GcsConfig, clock: Clock, store: Store) -> LockDir | None:
    """Same-host death detection (``ha.lock_dir``; ``off``: none).  The default directory
    is named for the store's cluster id (created there if absent), not its URL: members
    that reach one store by different URLs share it (issue 29 item 6)."""
    if config.ha.lock_dir == "off":
        return None
    if config.ha.lock_dir:
        return LockDir(pathlib.Path(config.ha.lock_dir), clock)
    cluster_id, _ = await stored_cluster_id(store)
    return LockDir(default_lock_dir(cluster_id.hex(), config.namespace), clock)


def standby_heap_freezer(
    config: GcsConfig, prepare: Callable[[], None] | None = None
) -> Callable[[], None]:
    """What the standby does off the takeover's path once its mirror loaded: ``prepare``
    the terms' parts (``GcsServer.prepared``), then freeze its start-up heap once (modules,
    the warm copy, those parts) as the ``gc`` component does at a plain start
    (``gcs.server.gc_policy``), so that the takeover's term pays for neither."""
    frozen = False

    def freeze() -> None:
        nonlocal frozen
        if prepare is not None:
            prepare()
        if config.gc_gen0_threshold > 0 and not frozen:
            frozen = True
            freeze_start_heap()

    return freeze


async def member(
    config: GcsConfig,
    store: Store,
    clock: Clock,
    metrics: GcsMetrics,
    start_term: StartTerm,
    *,
    prepare: Callable[[], None] | None = None,
) -> tuple[HaCoordinator, HaStatusServer | None]:
    """The member's lease loop, not yet running, and its status port (with
    ``ha.status_port``), started; ``prepare()`` once a mirror loaded (off the takeover)."""
    status: HaStatusServer | None = None
    if config.ha.status_port >= 0:
        status = HaStatusServer()
        await status.start(config.host, config.ha.status_port)
    ha = HaCoordinator(
        store,
        clock,
        HaSettings.of(config.ha),
        start_term=start_term,
        metrics=metrics,
        on_serving=status.set if status is not None else None,
        locks=await holder_locks(config, clock, store),
        on_mirror_loaded=standby_heap_freezer(config, prepare),
    )
    if status is not None:
        status.handover = ha.hand_over
    return ha, status


async def run_until_warm(ha: HaCoordinator) -> asyncio.Task[None]:
    """Start the lease loop; returns its task once the member is a warm standby (it may
    already lead), or raises what failed before."""
    running = await start_until_ready(ha.run(), ha.warm(), name="gcs-ha")
    if running.done():
        await running  # raises what failed
    return running
