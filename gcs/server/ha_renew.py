"""A leader's lease renewals (``gcs serve --ha``, :mod:`gcs.server.ha`): how long it trusts
its lease, and the loop that renews it until it is lost.

The trust is counted from when a renewal (or the acquire) was *sent*, for
``LEASE_SAFETY`` of the TTL: the store counts the TTL from when it processed the request, a
little later, so a leader never trusts its lease past the store's end of it (issue 29
items 1 and 3).  The coordinator reads the same :class:`LeaseTrust` for every call it
admits.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from gcs.base.clock import Clock, within
from gcs.store.errors import StoreError
from gcs.store.ha import HaStore

__all__ = ["LATE_RENEWAL", "LEASE_SAFETY", "LeaseTrust", "renew_until_lost"]

log = structlog.get_logger("gcs.ha")

LEASE_SAFETY = 0.9
"""Fraction of the TTL a leader trusts its lease for after a renewal started (the store
counts the TTL from when it processed the renewal, a little later: this is conservative,
and leaves room for clock-rate drift between hosts)."""
LATE_RENEWAL = 0.1
"""Fraction of the TTL a renewal *sent* after the trusted lease ended (the loop was busy,
e.g. loading a term; none was pending) may take to confirm before the leader steps down."""


@dataclass(slots=True)
class LeaseTrust:
    """Until when (the clock's monotonic seconds) the lease is certainly this member's."""

    ttl_ms: int
    until: float = 0.0

    @property
    def span_s(self) -> float:
        """How long a renewal sent now is trusted for."""
        return self.ttl_ms / 1000 * LEASE_SAFETY


async def renew_until_lost(
    ha: HaStore, clock: Clock, trust: LeaseTrust, *, holder: str, epoch: int, interval_ms: int
) -> None:
    """Renew every interval; returns (trust withdrawn: ``trust.until`` is 0) when the
    lease is lost, or when the trusted lease ended with no renewal confirmed.

    A renewal must be confirmed before the trusted lease ends: a leader already
    refusing calls is not extended by a late reply (item 3), it steps down then -- by
    the time its lease could have ended in the store, so its admitted calls are
    answered (item 2) and its clients go elsewhere.  A renewal *sent* late (the loop was
    busy, e.g. loading a term, with none pending) gets ``LATE_RENEWAL`` of the TTL."""
    interval_s = interval_ms / 1000
    last_s = clock.monotonic_s()
    failed = False
    # the store refuses a renewal arriving once this leader's trust surely ended
    least_ms = int(trust.ttl_ms * (1 - LEASE_SAFETY))
    while True:
        until_end_s = trust.until - clock.monotonic_s()
        next_s = interval_s - (clock.monotonic_s() - last_s)
        await clock.sleep(max(0.0, min(next_s, until_end_s)))
        started = last_s = clock.monotonic_s()
        left_s = trust.until - started
        if left_s <= 0:
            if failed or not await _renew_late(ha, clock, trust, holder, epoch, started):
                log.warning("ha.lease_lapsed", epoch=epoch, late_s=round(-left_s, 3))
                trust.until = 0.0
                return
            continue
        try:
            renewed = await within(
                clock,
                left_s,
                ha.renew_lease(holder, epoch, trust.ttl_ms, min_left_ms=least_ms),
            )
        except TimeoutError:
            log.warning("ha.lease_lapsed", epoch=epoch, reason="renewal not confirmed")
            trust.until = 0.0
            return
        except StoreError as err:
            log.warning("ha.renew_failed", epoch=epoch, error=str(err))
            failed = True
            continue  # tried again at the next interval, or the trust's end
        if not renewed:
            log.warning("ha.lease_lost", epoch=epoch)
            trust.until = 0.0
            return
        if clock.monotonic_s() >= trust.until:
            log.warning("ha.lease_lapsed", epoch=epoch, reason="renewal confirmed late")
            trust.until = 0.0
            return
        trust.until = started + trust.span_s
        failed = False


async def _renew_late(
    ha: HaStore, clock: Clock, trust: LeaseTrust, holder: str, epoch: int, started: float
) -> bool:
    """A renewal sent after the trust ended: confirmed within ``LATE_RENEWAL``?"""
    limit_s = trust.ttl_ms / 1000 * LATE_RENEWAL
    try:
        renewed = await within(clock, limit_s, ha.renew_lease(holder, epoch, trust.ttl_ms))
    except (TimeoutError, StoreError) as err:
        log.warning("ha.lease_lapsed", epoch=epoch, reason="late renewal", error=str(err))
        return False
    if not renewed or clock.monotonic_s() - started >= limit_s:
        log.warning("ha.lease_lapsed", epoch=epoch, reason="late renewal refused or late")
        return False
    trust.until = started + trust.span_s
    return True
