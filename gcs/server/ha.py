"""``gcs serve --ha``: one leader, hot standbys, fenced writes (issue 21 item 4).

Every member runs an :class:`HaCoordinator` on the same Redis / PostgreSQL store:

* **Standby.** Loads the tables the components load at start into a :class:`TableMirror`
  and keeps it current from the store's change stream.  It binds no port (the GCS port is
  the leader's: a standby's clients would be served stale state), so a health check on the
  shared address reaches the leader or nothing.  Every ``renew_interval_ms`` -- sooner when
  the lease says it lapses sooner -- it tries to take the lease.  A leader on the same host is
  watched through its lock file (:mod:`gcs.server.ha_lock`): its death frees its lease at
  once instead of after the TTL.
* **Takeover.** Lease taken (a new epoch) -> the store is fenced with it (from then on the
  ex-leader's writes are refused inside the store's own atomic step) -> the mirror drains
  the changes written before the fence -> one *term* starts: the server's components are
  wired afresh and load from the mirror (:class:`TakeoverStore`), then run and bind the
  shared port (SO_REUSEPORT).  Raylets see what they see at a restart: same address, node
  table loaded (no node is dead for the gap; the restart grace applies), NotifyGCSRestart.
* **Leader.** Renews the lease every ``renew_interval_ms`` (:mod:`.ha_renew`).  It
  answers a call only while its lease is certainly still its own
  (:meth:`HaCoordinator.admit`, asked per call: the local monotonic time of the last
  renewal's *start* plus 90% of the TTL), so a paused leader resumed past its lease
  refuses at once, before its renewal loop even runs.
  Losing the lease (a renewal refused, or not confirmed before that deadline) or any write
  refused as fenced -> step down at once: the term's components close with no grace
  (listeners and connections closed, held polls answered), and the member is a standby
  again (a fresh mirror load: its own state may be ahead of what the store kept).
* **Stop.** The term closes, the lease is released (a standby takes over without waiting
  for the TTL).

The coordinator does not know what a term is: the server hands it ``start_term`` (wire,
load, run until serving) and gets back a :class:`Term` to wait on and stop.  Time is the
injected clock (tests drive lease expiry with a ``FakeClock`` and ``MemoryStore(ha=True)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import structlog
from prometheus_client import Histogram
from prometheus_client.core import Metric

from gcs.base.background import Background, race
from gcs.base.clock import Clock, within
from gcs.config import HaConfig
from gcs.server.ha_cut import TermStore
from gcs.server.ha_gate import LinkGate
from gcs.server.ha_handover import (
    HandoverAsk,
    HandoverDesk,
    HandoverResult,
    HandoverTerm,
    lead_handover,
    standby_wait_s,
)
from gcs.server.ha_lock import HolderLocks
from gcs.server.ha_mirror import TableMirror, TakeoverStore
from gcs.server.ha_renew import LeaseTrust, renew_until_lost
from gcs.server.ha_steps import Steps
from gcs.server.ha_upgrade import check_mirror, expand_format
from gcs.server.metrics import GcsMetrics, counter, gauge
from gcs.store import Store
from gcs.store.errors import ChangesTrimmed, StoreError
from gcs.store.ha import HaStore, LeaseInfo

__all__ = ["HaCoordinator", "HaSettings", "Role", "Term", "default_holder"]

log = structlog.get_logger("gcs.ha")

RETRY_S = 0.2
"""Pause after a failed store call of a standby (before following / trying again)."""


class Role(enum.StrEnum):
    STANDBY = "standby"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class HaSettings:
    holder: str
    lease_ttl_ms: int
    renew_interval_ms: int

    @classmethod
    def of(cls, config: HaConfig) -> HaSettings:
        return cls(config.holder or default_holder(), config.lease_ttl_ms, config.renew_interval_ms)


def default_holder() -> str:
    """Unique per process: ``<hostname>:<pid>:<random>``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Term(Protocol):
    """One leader term of the server: loaded and serving when handed over."""

    async def wait(self) -> None:
        """Until the term fails (raises) -- it never ends on its own otherwise."""

    async def stop(self) -> None:
        """Close everything at once (no grace: it must not serve any more)."""


StartTerm = Callable[[TakeoverStore, Callable[[], bool]], Awaitable[Term]]
"""(the term's store, the per-call admit check) -> the term, loaded and serving."""


class HaCoordinator:
    """The lease loop of one member (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        settings: HaSettings,
        *,
        start_term: StartTerm,
        metrics: GcsMetrics | None = None,
        on_serving: Callable[[bool], None] | None = None,
        locks: HolderLocks | None = None,
        on_mirror_loaded: Callable[[], None] | None = None,
    ) -> None:
        """``on_serving(True)`` once a term serves, ``(False)`` as it ends (the HA status
        port's health answer).  ``locks``: same-host death detection
        (:mod:`gcs.server.ha_lock`); without it a dead leader's lease lapses by its TTL.
        ``on_mirror_loaded()`` after each full load of the standby's mirror (the server
        freezes its start-up heap there, off the takeover's path)."""
        self._on_mirror_loaded = on_mirror_loaded
        self._locks = locks
        self._watch: tuple[str, asyncio.Task[bool]] | None = None
        """(holder, its death watch) while a leader on this host is watched."""
        self._tasks = Background("ha")
        """The death watch and a term's renewals; closed when :meth:`run` ends."""
        self.fast_takeovers = 0
        """Leases of dead same-host holders released before their TTL."""
        self._on_serving = on_serving
        if not isinstance(store, HaStore):
            raise TypeError(f"{type(store).__name__} has no lease (built without ha=True?)")
        self._store = store
        self._ha: HaStore = store
        self._clock = clock
        self.settings = settings
        self._start_term = start_term
        self.role = Role.STANDBY
        self.epoch = 0
        self.takeovers = 0
        self.step_downs = 0
        self.last_takeover_s = 0.0
        self.mirror: TableMirror | None = None
        self._trust = LeaseTrust(settings.lease_ttl_ms)  # until when the lease is ours
        self._gate = LinkGate(settings.lease_ttl_ms / 1000)
        self._seen: LeaseInfo | None = None  # the last live lease read
        self._previous: LeaseInfo | None = None  # the lease this member took over
        self.ended_stalled = 0  # stalled same-host ex-leaders ended (item 5)
        self.stranded = 0  # calls waiting on the store at a step-down (answered then)
        self._fenced = asyncio.Event()
        self._warm = asyncio.Event()
        self._leading = asyncio.Event()
        self._standing_by = asyncio.Event()
        self._term: Term | None = None
        self._handovers = HandoverDesk()  # a planned handover asked of this leader
        self._steps = Steps(clock)  # the next takeover's (logged with ha.leader)
        self._stopped = False
        self._histogram: Histogram | None = None
        if metrics is not None:
            self._histogram = Histogram(
                "gcs_ha_takeover_seconds",
                "From taking the lease to serving (fence, drain, load from the mirror, bind)",
                buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30),
                registry=metrics.registry,
            )
            metrics.add_source(self.metric_families)

    # -- what the server, tests and metrics read ---------------------------------------------
    def admit(self) -> bool:
        """Whether a call may be answered now: leader, and the lease certainly still ours."""
        return self.role is Role.LEADER and self._clock.monotonic_s() < self._trust.until

    @property
    def serving(self) -> bool:
        """Leader, with its term loaded and serving (``role`` turns leader before the term
        loads, so that the term's first call is admitted)."""
        return self._leading.is_set()

    async def warm(self) -> None:
        """Returns once the first mirror load finished (this member can take over)."""
        await self._warm.wait()

    async def leading(self) -> None:
        """Returns once this member serves as the leader."""
        await self._leading.wait()

    async def standing_by(self) -> None:
        """Returns once this member is (again) a standby, its mirror loaded."""
        await self._standing_by.wait()

    async def hand_over(self, to: str = "", *, then_stop: bool = False) -> HandoverResult:
        """A planned handover (:mod:`gcs.server.ha_handover`) to ``to`` (empty: any standby);
        returns once a successor serves, or the lease TTL passed without one.  The member is
        a standby afterwards, or (``then_stop``) :meth:`run` returns.  Raises
        :class:`~gcs.server.ha_handover.NotLeader` unless this member serves."""
        return await self._handovers.request(
            to, then_stop=then_stop, serving=self.serving, holder=self.settings.holder
        )

    def describe(self) -> dict[str, object]:
        return {
            "role": str(self.role),
            "holder": self.settings.holder,
            "epoch": self.epoch,
            "takeovers": self.takeovers,
        }

    def metric_families(self) -> Iterable[Metric]:
        return [
            gauge(
                "gcs_ha_role",
                "1 for this member's role (leader or standby) in the HA group",
                {(str(role),): float(self.role is role) for role in Role},
                labels=("role",),
            ),
            gauge("gcs_ha_epoch", "Lease epoch of this member's last term", float(self.epoch)),
            counter("gcs_ha_takeovers", "Terms this member started", self.takeovers),
            counter(
                "gcs_ha_step_downs",
                "Terms this member ended because its lease was lost or a write was fenced",
                self.step_downs,
            ),
        ]

    # -- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        """Standby -> leader -> standby ... until cancelled (then the lease is released).
        A term that fails for another reason than losing the lease raises here."""
        if self._locks is not None:
            await self._locks.hold(self.settings.holder)
        try:
            while not self._stopped:  # a planned stop hands over, then ends here
                epoch = await self._stand_by()
                await self._lead(epoch)
        finally:
            await self._unwatch()
            await self._tasks.close()
            await self._stop_term()
            await self._release()
            if self._locks is not None:
                self._locks.release()

    async def _stand_by(self) -> int:
        """Load and follow the mirror until the lease is ours: its epoch."""
        holder = self.settings.holder
        self.role = Role.STANDBY
        self._leading.clear()
        mirror = self.mirror = TableMirror()
        self._steps = Steps(self._clock)
        await self._load(mirror)
        check_mirror(mirror)  # a store in a newer format: this member stops, StoreTooNew
        if self._on_mirror_loaded is not None:
            self._on_mirror_loaded()
        self._warm.set()
        self._standing_by.set()
        log.info("ha.standby", holder=holder, rows=mirror.rows, cursor=mirror.cursor.decode())
        while True:
            wait_s, lease = await self._next_attempt()
            if self._gate.may_compete(lease, self._clock.monotonic_s()):
                epoch = await self._acquire()
                if epoch is not None:
                    self._steps.mark("acquired")
                    seen = self._seen  # a lapsed Redis lease reads as none: the last live
                    self._previous = seen if seen and seen.epoch == epoch - 1 else None
                    return epoch
            wait_s = standby_wait_s(mirror.notice, lease, holder, wait_s)
            died, notices = self._watch_holder(lease), mirror.notices
            if await self._follow_until(wait_s, died) and lease is not None:
                await self._release_dead(lease)
            if mirror.notices != notices and mirror.notice and mirror.notice.for_member(holder):
                self._steps.mark("noticed")  # a handover to this member
            check_mirror(mirror)

    async def _acquire(self) -> int | None:
        """Try to take the lease: its epoch, trusted from when the request was *sent* (a
        reply handled late must not stretch it: item 1); None if not taken, or taken with
        a reply so late that nothing of the trust is left (then given back at once)."""
        clock, settings = self._clock, self.settings
        sent = clock.monotonic_s()
        try:
            epoch = await self._ha.try_acquire_lease(settings.holder, settings.lease_ttl_ms)
        except StoreError as err:
            log.warning("ha.acquire_failed", error=str(err))
            await clock.sleep(RETRY_S)  # not at once again (a free lease says "now")
            return None
        if epoch is None:
            return None
        await self._unwatch()
        self._trust.until = sent + self._trust.span_s
        late_s = clock.monotonic_s() - self._trust.until
        if late_s >= 0:
            log.warning("ha.acquired_too_late", epoch=epoch, late_s=round(late_s, 3))
            await self._give_back(epoch)
            return None
        return epoch

    async def _give_back(self, epoch: int) -> None:
        """Release a lease this member cannot trust (bounded)."""
        try:
            await within(
                self._clock,
                self.settings.lease_ttl_ms / 1000,
                self._ha.release_lease(self.settings.holder, epoch),
            )
        except (StoreError, TimeoutError) as err:
            log.warning("ha.release_failed", epoch=epoch, error=str(err))

    async def _load(self, mirror: TableMirror) -> None:
        while True:
            try:
                await mirror.load(self._ha)
                return
            except StoreError as err:
                log.warning("ha.mirror_load_failed", error=str(err))
                await self._clock.sleep(RETRY_S)

    async def _next_attempt(self) -> tuple[float, LeaseInfo | None]:
        """Seconds to the next try (the renewal interval, or sooner when the lease lapses
        sooner: a dead leader's) and the lease as read (None: free, or unreadable)."""
        wait_s = self.settings.renew_interval_ms / 1000
        sent = self._clock.monotonic_s()
        try:
            lease = await self._ha.read_lease()
        except StoreError:
            self._gate.link_s = self._clock.monotonic_s() - sent
            return wait_s, None
        self._gate.link_s = self._clock.monotonic_s() - sent
        if lease is not None:
            self._seen = lease
        if lease is None:
            return 0.0, None
        return max(0.0, min(wait_s, lease.remaining_ms / 1000)), lease

    def _watch_holder(self, lease: LeaseInfo | None) -> asyncio.Task[bool] | None:
        """The death watch of the lease's holder when it runs on this host (kept across
        attempts while the holder stays the same: a lock seen free the first time proves
        nothing, so a watch must start while the holder lives)."""
        if self._locks is None or lease is None or lease.holder == self.settings.holder:
            return None
        if self._watch is not None:
            holder, task = self._watch
            if holder == lease.holder:
                return None if task.done() else task  # done here: the watch itself failed
            task.cancel()
            self._watch = None
        died = self._locks.watch(lease.holder)
        if died is None:
            return None
        task = self._tasks.start(_watching(died), "watch-holder")
        self._watch = (lease.holder, task)
        log.info("ha.watching_holder", holder=lease.holder)
        return task

    async def _unwatch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch[1].cancel()
            await asyncio.gather(watch[1], return_exceptions=True)

    async def _release_dead(self, lease: LeaseInfo) -> None:
        """The holder's process died on this host: free its lease now (only if ``(holder,
        epoch)`` still holds it -- the store compares atomically) instead of waiting for
        the TTL; the next attempt acquires normally, fenced as ever."""
        self._watch = None
        log.warning(
            "ha.holder_died",
            holder=lease.holder,
            epoch=lease.epoch,
            ttl_left_ms=lease.remaining_ms,
        )
        try:
            await self._ha.release_lease(lease.holder, lease.epoch)
        except StoreError as err:
            log.warning("ha.release_dead_failed", error=str(err))
            return
        self.fast_takeovers += 1

    async def _follow_until(self, wait_s: float, died: asyncio.Task[bool] | None = None) -> bool:
        """Apply changes for ``wait_s`` seconds of the clock, or until ``died`` completes
        (then True: the watched holder died)."""
        mirror = self.mirror
        assert mirror is not None
        deadline = self._clock.monotonic_s() + wait_s
        notices = mirror.notices  # a handover notice arriving: try the lease at once
        while (left_s := deadline - self._clock.monotonic_s()) > 0 and mirror.notices == notices:
            if died is not None and died.done():
                return _died(died)
            follow: Awaitable[object] = mirror.follow(self._ha, block_ms=max(1, int(left_s * 1000)))
            if died is not None:
                # cancelling a follow applies nothing: the mirror and its cursor move
                # together after the read
                follow, _ = await race(follow, asyncio.shield(died))
                if follow.cancelled():
                    return _died(died)
            try:
                await follow
            except ChangesTrimmed as err:
                log.warning("ha.mirror_reload", reason=str(err))
                await self._load(mirror)
            except StoreError as err:
                log.warning("ha.follow_failed", error=str(err))
                await self._clock.sleep(min(RETRY_S, left_s))
        if wait_s <= 0:
            await asyncio.sleep(0)
        return died is not None and died.done() and _died(died)

    async def _lead(self, epoch: int) -> None:
        """One term: fence, drain, load, serve; returns once the lease is lost (or fenced)."""
        clock, settings = self._clock, self.settings
        started = clock.monotonic_s()
        self.epoch = epoch
        self._fenced.clear()
        self._standing_by.clear()
        self._ha.fence(epoch)
        mirror = self.mirror
        assert mirror is not None
        self._mark(Role.LEADER, epoch)
        drained = await mirror.drain(self._ha)
        await expand_format(self._store, mirror)
        self._steps.mark("drained")
        store = TermStore(self._store, mirror, on_fenced=self._fenced.set)
        self.role = Role.LEADER  # admit() may answer True once the term serves
        # renewals start now: loading a big state must not outlast the lease
        renewing = renew_until_lost(
            self._ha,
            clock,
            self._trust,
            holder=settings.holder,
            epoch=epoch,
            interval_ms=settings.renew_interval_ms,
        )
        renew = self._tasks.start(renewing, "renew")
        try:
            term = self._term = await self._start_term(store, self.admit)
        except BaseException as err:
            self.role = Role.STANDBY
            self._mark(Role.STANDBY, epoch)
            store.cut()
            renew.cancel()
            await asyncio.gather(renew, return_exceptions=True)
            if not isinstance(err, Exception) or not self._fenced.is_set():
                raise
            self.step_downs += 1
            log.warning("ha.step_down", epoch=epoch, reason="fenced while loading", error=repr(err))
            return
        store.release_mirror()
        self.mirror = None
        self._steps.merge(getattr(term, "steps", {}))
        self._steps.mark("serving")
        took_s = clock.monotonic_s() - started
        self.takeovers += 1
        self.last_takeover_s = took_s
        if self._histogram is not None:
            self._histogram.observe(took_s)
        self._leading.set()
        if self._on_serving is not None:
            self._on_serving(True)
        took = {"takeover_s": round(took_s, 3), "drained_changes": drained}
        log.info(
            "ha.leader", holder=settings.holder, epoch=epoch, steps=self._steps.fields(), **took
        )
        self._end_stalled()
        try:
            _, _, failed, asked = await race(
                asyncio.shield(renew),
                self._fenced.wait(),
                term.wait(),
                self._handovers.asked.wait(),
            )
            if asked.done() and not asked.cancelled():
                await self._lead_handover(epoch, term, renew)
                return
        finally:
            self.role = Role.STANDBY  # refuse every call from now on, before closing
            self._mark(Role.STANDBY, epoch)
            store.cut()  # calls waiting on the store are answered now (item 2)
            self.stranded += store.stranded
            self._leading.clear()
            if self._on_serving is not None:
                self._on_serving(False)
            renew.cancel()  # cancelled with the race if it was cancelled
            await asyncio.gather(renew, return_exceptions=True)
        reason = "fenced" if self._fenced.is_set() else "lease lost"
        if failed.done() and not failed.cancelled() and not self._fenced.is_set():
            error = failed.exception()
            if error is not None:
                await self._stop_term()
                raise error
        self.step_downs += 1
        log.warning(
            "ha.step_down",
            holder=settings.holder,
            epoch=epoch,
            reason=reason,
            stranded=store.stranded,
        )
        await self._stop_term()
        if reason == "lease lost":
            # a renewal may still be on its way to the store and extend the lease of a
            # member that no longer serves (item 3): give it back behind that renewal
            await self._give_back(epoch)

    def _mark(self, role: Role, epoch: int) -> None:  # read by a new leader (item 5)
        if self._locks is not None:
            self._locks.mark(str(role), epoch)

    def _end_stalled(self) -> None:
        """The lease was taken from a holder on this host whose record still says it leads:
        it is stalled (paused, hung), and its connections hold its clients; end it so the
        kernel closes them and they reconnect here (item 5)."""
        previous, self._previous = self._previous, None
        if self._locks is None or previous is None or previous.holder == self.settings.holder:
            return
        pid = self._locks.end(previous.holder, previous.epoch)
        if pid is not None:
            self.ended_stalled += 1
            log.warning(
                "ha.ended_stalled_leader", holder=previous.holder, epoch=previous.epoch, pid=pid
            )

    async def _lead_handover(self, epoch: int, term: Term, renew: asyncio.Task[None]) -> None:
        """The handover asked by :meth:`hand_over` (:mod:`gcs.server.ha_handover`)."""

        async def stop_renewing() -> None:
            self._trust.until = 0.0  # admit() refuses from now on
            # before the lease is given: the successor ends a same-host holder whose record
            # still says it leads (a stalled one), not one handing over
            self._mark(Role.STANDBY, epoch)
            renew.cancel()
            # a renewal in flight was sent before the release that follows (it lands
            # first); a store call that ignores its cancellation must not hold the handover
            with contextlib.suppress(TimeoutError):
                await within(self._clock, RETRY_S, asyncio.gather(renew, return_exceptions=True))

        async def lead(ask: HandoverAsk) -> HandoverResult:
            self._stopped = ask.then_stop
            assert isinstance(term, HandoverTerm)
            settings = self.settings
            return await lead_handover(
                store=self._store,
                ha=self._ha,
                clock=self._clock,
                holder=settings.holder,
                epoch=epoch,
                to=ask.to,
                ttl_s=settings.lease_ttl_ms / 1000,
                take_s=2 * settings.renew_interval_ms / 1000,
                term=term,
                stop_renewing=stop_renewing,
            )

        failed = await self._handovers.answer(lead, stop_term=self._stop_term)
        if failed is not None:  # the notice was refused (fenced) or not written
            self.step_downs += 1
            log.warning("ha.step_down", epoch=epoch, reason="handover failed", error=str(failed))

    async def _stop_term(self) -> None:
        term, self._term = self._term, None
        if term is not None:
            await term.stop()

    async def _release(self) -> None:
        if self.epoch and self.takeovers:
            with contextlib.suppress(StoreError, asyncio.CancelledError, TimeoutError):
                ttl_s = self.settings.lease_ttl_ms / 1000  # a cut link must not hang the stop
                await within(
                    self._clock, ttl_s, self._ha.release_lease(self.settings.holder, self.epoch)
                )


async def _watching(died: Awaitable[None]) -> bool:
    """A death watch: True once it saw the holder die, False if the watch failed."""
    try:
        await died
    except Exception as error:
        log.warning("ha.watch_failed", error=repr(error))
        return False
    return True


def _died(watch: asyncio.Task[bool]) -> bool:
    """A finished death watch: True when it saw the holder die (not cancelled, no error)."""
    return not watch.cancelled() and watch.result()
