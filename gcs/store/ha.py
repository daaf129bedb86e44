"""What a store offers a highly available GCS (``gcs serve --ha``): a leader lease with
fencing, and a change stream that keeps standbys warm.

The contract (every backend that supports ``--ha`` implements :class:`HaStore`; the memory
store implements it too, as the reference and for in-process tests):

* **Lease.** One lease per namespace.  :meth:`HaStore.try_acquire_lease` takes it when it is
  free or expired and returns a new *epoch*, strictly greater than every epoch granted
  before in this namespace (epochs survive the lease's expiry and a store restart).  Expiry
  is judged on the store's clock (Redis ``TIME`` / ``PEXPIRE``, SQL ``now()``), never on a
  GCS host's clock.  :meth:`HaStore.renew_lease` extends it only while ``(holder, epoch)``
  still holds it.
* **Fencing.** After :meth:`HaStore.fence` ``(epoch)`` every ``write`` and ``increment`` of
  this store object is refused, atomically with the write itself (inside the same Lua script
  / SQL transaction), once any newer epoch has been granted: it raises
  :class:`StoreFenced` and nothing is written.  A paused or partitioned ex-leader can
  therefore never write again, whatever its clock says.
* **Change stream.** Every applied batch (puts, deletes, counter values) is appended, in
  the same atomic step, to a bounded stream.  :meth:`HaStore.read_changes` returns the
  changes after a cursor (waiting up to ``block_ms`` when there are none).  A cursor older
  than what the stream retains raises :class:`ChangesTrimmed` (the follower reloads).
  To start following: ``cursor = await store.change_cursor()``, then load the tables, then
  apply changes after ``cursor`` (a change already in the loaded state is harmless to
  re-apply: every change carries the final value of its key).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from gcs.store.errors import ChangesTrimmed, StoreFenced

__all__ = [
    "Change",
    "ChangeCursor",
    "ChangesTrimmed",
    "HaStore",
    "LeaseInfo",
    "StoreFenced",
]

ChangeCursor = bytes
"""Opaque position in the change stream (backend-specific encoding)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One key's new state.  ``table`` is a store table, or ``""`` for a counter (then
    ``key`` is the counter's name and ``value`` its decimal value)."""

    table: str
    key: bytes
    value: bytes | None
    """``None``: the key was deleted."""


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    holder: str
    epoch: int
    remaining_ms: int
    """Time left on the store's clock when it was read (0 or less: expired)."""


class HaStore(abc.ABC):
    """Mixin for :class:`gcs.store.Store` backends that support ``--ha``."""

    @abc.abstractmethod
    async def try_acquire_lease(self, holder: str, ttl_ms: int) -> int | None:
        """Take the lease if free, expired, or already ``holder``'s: the new epoch.  None
        while another holder's lease is live."""

    @abc.abstractmethod
    async def renew_lease(
        self, holder: str, epoch: int, ttl_ms: int, *, min_left_ms: int = 0
    ) -> bool:
        """Extend the lease by ``ttl_ms`` from now (store clock); False if ``(holder,
        epoch)`` no longer holds it (lost: expired and taken, or never held).  A lease that
        lapsed with nobody taking it since is still held (no newer epoch exists) and is
        renewed -- unless ``min_left_ms`` > 0: then a renewal arriving with less than that
        left on the lease is refused (False): it arrived after its leader stopped trusting
        the lease, and must not extend a member that no longer serves."""

    @abc.abstractmethod
    async def release_lease(self, holder: str, epoch: int) -> None:
        """Give the lease up now (a clean shutdown), if ``(holder, epoch)`` holds it."""

    @abc.abstractmethod
    async def read_lease(self) -> LeaseInfo | None:
        """The lease as the store sees it now; None if never taken or expired and gone."""

    @abc.abstractmethod
    def fence(self, epoch: int) -> None:
        """From now on this store object's writes carry ``epoch`` (see the module doc)."""

    @abc.abstractmethod
    async def change_cursor(self) -> ChangeCursor:
        """The stream's current end (changes after it are not yet written)."""

    @abc.abstractmethod
    async def read_changes(
        self, after: ChangeCursor, *, block_ms: int = 0, limit: int = 10_000
    ) -> tuple[ChangeCursor, list[Change]]:
        """Changes after ``after`` in write order and the cursor after the last one.

        ``limit`` bounds the changes returned, in whole batches (a batch bigger than
        ``limit`` comes alone): a follower never sees half a batch."""
