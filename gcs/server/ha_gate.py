"""Whether a standby competes for the lease now (issue 29 item 4).

A standby whose store link is slow -- its lease read took over ``SLOW_LINK`` of the TTL --
would trust a lease it won for little of its TTL, its renewals could not keep it, and a
healthy standby would wait a full TTL meanwhile.  It leaves the lease to a healthier member,
and competes anyway once its reads are fast again, or once the lease stayed free for a TTL
(no healthy member left to take it).
"""

from __future__ import annotations

import structlog

from gcs.store.ha import LeaseInfo

__all__ = ["SLOW_LINK", "LinkGate"]

log = structlog.get_logger("gcs.ha")

SLOW_LINK = 0.25
"""Fraction of the TTL a lease read may take for the standby to compete."""


class LinkGate:
    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self.link_s = 0.0
        """How long the last lease read took (the store link's round trip)."""
        self._free_since: float | None = None
        self._slow = False

    def may_compete(self, lease: LeaseInfo | None, now: float) -> bool:
        if lease is not None and lease.remaining_ms > 0:
            self._free_since = None
        elif self._free_since is None:
            self._free_since = now
        if self.link_s <= self._ttl_s * SLOW_LINK:
            self._slow = False
            return True
        if self._free_since is not None and now - self._free_since >= self._ttl_s:
            return True
        if not self._slow:  # once per slow spell
            self._slow = True
            log.warning("ha.slow_link", link_s=round(self.link_s, 3))
        return False
