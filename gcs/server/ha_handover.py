"""A planned handover of an HA group's leadership (``gcs ha handover``; SIGTERM to a leader).

A leader that is told to go (:meth:`gcs.server.ha.HaCoordinator.hand_over`):

1. **holds** new calls: the front server parks each new request unanswered (no handler sees
   it) and ends the syncer streams (a raylet reopens its own: held too);
2. **quiesces**: held long polls are answered, the calls already admitted finish (at most
   ``DRAIN_S``);
3. writes a **notice** (table ``GCS_HA``, through its fenced store).  It travels the change
   stream like every write, so a standby blocked on the stream sees it at once, with every
   change the leader made before it already applied: the notice is the change-stream
   position the successor needs (its drain after the fence finds nothing more; no reload,
   no waiting for the TTL);
4. stops renewing, withdraws its own trust (``admit()`` is False) and **releases** the lease;
5. **waits** until a successor serves (it records itself in InternalKV ``gcs_ha/leader``
   with a newer epoch once its port serves), at most the lease TTL, woken by each write
   in the change stream (the record is one) rather than polling;
6. **hands off**: stops listening, refuses every held request with ``RST_STREAM
   REFUSED_STREAM`` and sends GOAWAY on every connection.  A refused stream was seen by no
   handler, so gRPC clients (C-core: Python, Ray's C++ workers and raylets) retry it
   transparently on a new connection -- which the kernel gives the successor (it bound the
   shared port last and steers new connections to itself, :mod:`gcs.front.reuseport`).

A standby that sees a notice for it (addressed to it, or to anyone) tries the lease every
``POLL_S`` instead of every renewal interval until the lease is free.  Without a standby the
leader stops once no member took the released lease within two renewal intervals (every
standby tries a free lease at least that often), as a plain stop would (the held calls
then fail).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

import structlog

from gcs.base.background import race
from gcs.base.clock import Clock
from gcs.server.ha_steps import Steps
from gcs.store import Store
from gcs.store.base import WriteBatch
from gcs.store.errors import StoreError
from gcs.store.ha import Change, ChangeCursor, HaStore, LeaseInfo

__all__ = [
    "DRAIN_S",
    "NOTICE_KEY",
    "POLL_S",
    "TABLE_HA",
    "HandoverDesk",
    "HandoverNotice",
    "HandoverResult",
    "HandoverTerm",
    "NotLeader",
    "lead_handover",
    "planned_stop",
    "standby_wait_s",
]

log = structlog.get_logger("gcs.ha")

TABLE_HA = "GCS_HA"
"""The HA group's own records (not mirrored, never loaded by a component)."""
NOTICE_KEY = b"handover"
POLL_S = 0.002
"""How often a standby told of a handover tries the lease (one store round trip), and how
long a leader waiting for its successor pauses after a failed store call."""
WATCH_LIMIT = 100
"""Changes read per wake-up by a leader waiting for its successor (it only looks again)."""
DRAIN_S = 1.0
"""How long admitted calls may take to finish before the lease is handed over (calls still
open then are ended with the term, as at a plain stop)."""


class NotLeader(Exception):
    """A handover was asked of a member that does not lead (or is already handing over)."""


@dataclass(frozen=True, slots=True)
class HandoverNotice:
    holder: str
    """The leader handing over."""
    epoch: int
    """Its lease's epoch (a notice of an older epoch is stale)."""
    to: str = ""
    """The standby meant to take over; empty: any."""

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> HandoverNotice | None:
        """None for a deleted or unreadable notice (a newer version's: ignored)."""
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return cls(str(data["holder"]), int(data["epoch"]), str(data.get("to", "")))
        except (ValueError, KeyError, TypeError):
            return None

    def for_member(self, holder: str) -> bool:
        return not self.to or self.to == holder


@dataclass(frozen=True, slots=True)
class HandoverResult:
    handed_over: bool
    """A successor serves (else the leader stopped with nobody to take over)."""
    successor: str
    epoch: int
    """The successor's epoch (0 without one)."""
    refused: int
    """Held calls refused to be retried at the successor."""
    still_open: int
    """Admitted calls that did not finish within ``DRAIN_S`` (ended with the term)."""
    took_ms: float
    """From holding calls to the successor serving (or giving up)."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@runtime_checkable
class HandoverTerm(Protocol):
    """What a handover needs of the leader's term (``gcs.server.ha_member.LeaderTerm``)."""

    def hold(self) -> None: ...

    async def quiesce(self, bound_s: float) -> int: ...

    def hand_off(self) -> int: ...

    async def leader_record(self) -> bytes | None: ...

    def recorded_in(self, change: Change) -> bytes | None: ...


async def lead_handover(
    *,
    store: Store,
    ha: HaStore,
    clock: Clock,
    holder: str,
    epoch: int,
    to: str,
    ttl_s: float,
    take_s: float,
    term: HandoverTerm,
    stop_renewing: Callable[[], Awaitable[None]],
) -> HandoverResult:
    """Steps 1-6 of the module docstring; ``store`` is fenced with ``epoch``; a lease not
    taken within ``take_s`` of its release means no standby is there (every standby tries a
    free lease at least once per renewal interval, told of the handover or not).  Raises
    ``StoreError`` (``StoreFenced``) if the notice cannot be written: the lease is then
    not ours to hand over, and the caller steps down as after a lost lease."""
    started = clock.monotonic_s()
    steps = Steps(clock)
    term.hold()
    steps.mark("held")
    still_open = await term.quiesce(DRAIN_S)
    steps.mark("quiesced")
    notice = HandoverNotice(holder, epoch, to)
    await store.write(WriteBatch().put(TABLE_HA, NOTICE_KEY, notice.encode()))
    steps.mark("notice_written")
    await stop_renewing()
    try:
        await ha.release_lease(holder, epoch)
    except StoreError as err:  # the successor waits for the TTL instead
        log.warning("ha.handover_release_failed", error=str(err))
    released = clock.monotonic_s()
    steps.mark("released")
    successor = await _successor(
        ha, clock, holder, epoch, term, take_by=released + take_s, deadline=started + ttl_s
    )
    steps.mark("successor_seen")
    refused = term.hand_off()
    steps.mark("handed_off")
    result = HandoverResult(
        handed_over=successor is not None,
        successor=successor.holder if successor is not None else "",
        epoch=successor.epoch if successor is not None else 0,
        refused=refused,
        still_open=still_open,
        took_ms=round((clock.monotonic_s() - started) * 1000, 3),
    )
    log.info(
        "ha.handed_over", holder=holder, from_epoch=epoch, steps=steps.fields(), **result.as_dict()
    )
    return result


async def _successor(
    ha: HaStore,
    clock: Clock,
    holder: str,
    epoch: int,
    term: HandoverTerm,
    *,
    take_by: float,
    deadline: float,
) -> LeaseInfo | None:
    """The lease of the member that took over and serves, or None: the lease still free at
    ``take_by``, or its taker not serving by ``deadline``.  Between two looks it blocks on
    the change stream, not on a poll interval: the successor's leader record is a write
    there, seen (with its value) one store round trip after it landed."""
    cursor: ChangeCursor | None = None
    recorded = 0
    lease: LeaseInfo | None = None
    while (now := clock.monotonic_s()) < deadline:
        try:
            if cursor is None:  # at first, and after a failure: look again from here
                cursor = await ha.change_cursor()
                recorded = max(recorded, _recorded_epoch(await term.leader_record()))
                lease = None
            if lease is None or recorded >= lease.epoch:
                found = await ha.read_lease()
                taken = found is not None and found.holder != holder and found.epoch > epoch
                lease = found if taken else None
            if lease is None and now > take_by:
                return None
            if lease is not None and recorded >= lease.epoch:
                return lease
            until = deadline if lease is not None else min(deadline, take_by)
            block_ms = max(1, int((until - clock.monotonic_s()) * 1000) + 1)
            cursor, changes = await ha.read_changes(cursor, block_ms=block_ms, limit=WATCH_LIMIT)
            for change in changes:
                value = term.recorded_in(change)
                if value is not None:
                    recorded = max(recorded, _recorded_epoch(value))
        except StoreError as err:
            log.warning("ha.handover_poll_failed", error=str(err))
            cursor = None
            await clock.sleep(POLL_S)
    return None


def _recorded_epoch(raw: bytes | None) -> int:
    try:
        return int(json.loads(raw or b"{}").get("epoch", 0))
    except (ValueError, TypeError, AttributeError):
        return 0


@dataclass(frozen=True, slots=True)
class HandoverAsk:
    to: str
    """The standby meant to take over; empty: any."""
    then_stop: bool
    """The member stops once it handed over (SIGTERM), instead of standing by."""
    done: asyncio.Future[HandoverResult]


class HandoverDesk:
    """Where a leader's coordinator takes a handover asked of it (``gcs ha handover``,
    SIGTERM) and hands back its result: one at a time, led by the running term."""

    def __init__(self) -> None:
        self.ask: HandoverAsk | None = None
        self.asked = asyncio.Event()
        """Set while a handover waits for the term to lead it."""

    async def request(
        self, to: str, *, then_stop: bool, serving: bool, holder: str
    ) -> HandoverResult:
        """Ask (``serving``: this member's term serves) and wait for the result; raises
        :class:`NotLeader` unless it serves and no other handover runs."""
        if not serving or self.ask is not None:
            raise NotLeader(f"{holder} is not serving as the leader")
        done: asyncio.Future[HandoverResult] = asyncio.get_running_loop().create_future()
        self.ask = HandoverAsk(to, then_stop, done)
        self.asked.set()
        return await asyncio.shield(done)

    async def answer(
        self,
        lead: Callable[[HandoverAsk], Awaitable[HandoverResult]],
        *,
        stop_term: Callable[[], Awaitable[None]],
    ) -> StoreError | None:
        """Run ``lead`` for the waiting ask, stop the term, hand the result back; the
        error when the notice could not be written (the lease is not ours to hand over:
        the caller steps down as after a lost lease)."""
        ask = self.ask
        assert ask is not None, "answer() without an ask"
        try:
            result = await lead(ask)
        except StoreError as err:
            _fail(ask, f"the handover failed: {err}")
            return err
        except BaseException:
            _fail(ask, "the member stopped during the handover")
            raise
        finally:
            self.ask = None
            self.asked.clear()
            await stop_term()
        if not ask.done.done():
            ask.done.set_result(result)
        return None


def _fail(ask: HandoverAsk, message: str) -> None:
    if not ask.done.done():
        ask.done.set_exception(NotLeader(message))


class Leader(Protocol):
    """The coordinator, as :func:`planned_stop` sees it."""

    @property
    def serving(self) -> bool: ...

    async def hand_over(self, to: str = "", *, then_stop: bool = False) -> HandoverResult: ...


class _StatusPort(Protocol):
    async def close(self) -> None: ...


async def planned_stop(leader: Leader, running: asyncio.Task[None]) -> None:
    """SIGTERM to a leader: hand over first (a standby takes over with no failed call);
    returns once that is done, failed, or the member's loop ended meanwhile."""
    handing, _ = await race(leader.hand_over(then_stop=True), asyncio.shield(running))
    if handing.done() and not handing.cancelled() and handing.exception() is not None:
        log.warning("ha.planned_stop_without_handover", error=str(handing.exception()))


async def stop_member(
    leader: Leader,
    running: asyncio.Task[None] | None,
    status: _StatusPort | None,
    *,
    hand_over: bool,
) -> None:
    """``GcsServer.stop`` of an HA member: a serving leader hands over first (with
    ``hand_over``, from ``gcs serve``'s SIGTERM); then the lease loop ends (its term closes,
    the lease is released) and the status port closes."""
    if hand_over and leader.serving and running is not None:
        await planned_stop(leader, running)
    if running is not None:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    if status is not None:
        await status.close()


def standby_wait_s(
    notice: HandoverNotice | None, lease: LeaseInfo | None, holder: str, wait_s: float
) -> float:
    """A standby's wait before its next try for the lease: ``POLL_S`` while the leader that
    announced a handover to it still holds the lease (it releases it in a moment)."""
    if notice is None or not notice.for_member(holder) or lease is None:
        return wait_s
    if lease.holder == notice.holder and lease.epoch == notice.epoch:
        return min(wait_s, POLL_S)
    return wait_s
