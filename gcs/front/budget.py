"""One server-wide byte budget for what the front server holds for its clients: request
bytes received and not yet consumed (a message still arriving) and reply bytes waiting
for a client to read them.

Input is admitted, not dropped: a connection is given flow-control credit only while the
budget has room, so a peer that sends without finishing its messages runs out of window
instead of growing the heap (what is held can exceed the budget by at most the credit
already given: one connection window per connection).  Two exceptions keep it live:

* a connection that holds (almost) nothing always keeps a small window (``floor``): a
  client sending small requests is never starved by others' large ones;
* one connection at a time may go past the budget (the *pass*) while all its held bytes
  belong to one stream: one message larger than the budget still gets through, and two
  large messages that each filled half the budget cannot wait on each other forever.

Output past the budget is refused by the connection that would queue it (see
:meth:`gcs.front.h2.H2ServerConnection`), with the same single-stream pass.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Holder(Protocol):
    def retry_credit(self) -> None:
        """Budget came back: try to grant the flow-control credit held back."""


class ByteBudget:
    __slots__ = ("_wake_scheduled", "input_pass", "limit", "output_pass", "used", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.input_pass: object | None = None
        self.output_pass: object | None = None
        self.waiting: dict[Holder, None] = {}
        self._wake_scheduled = False

    def room(self, size: int) -> bool:
        return self.used + size <= self.limit

    def take(self, size: int) -> None:
        """Counted whatever the limit (the caller decided it may)."""
        self.used += size

    def give(self, size: int) -> None:
        self.used -= size
        if self.waiting and self.used < self.limit and not self._wake_scheduled:
            self._wake_scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self._wake)
            except RuntimeError:  # no loop (a connection torn down at exit)
                self._wake()

    def admit_input(self, holder: Holder, *, single_stream: bool) -> bool:
        """Whether ``holder`` may be given more flow-control credit; if not, it is told when
        there may be room (:meth:`Holder.retry_credit`)."""
        if self.used <= self.limit or self.input_pass is holder:
            return True
        if self.input_pass is None and single_stream:
            self.input_pass = holder
            return True
        self.waiting[holder] = None
        return False

    def forget_input(self, holder: object) -> None:
        """``holder`` holds no request bytes any more (or is gone): its input pass goes back."""
        if self.input_pass is holder:
            self.input_pass = None
        self.waiting.pop(holder, None)  # type: ignore[call-overload]

    def forget_output(self, holder: object) -> None:
        """``holder`` has no reply bytes waiting any more (or is gone)."""
        if self.output_pass is holder:
            self.output_pass = None

    def _wake(self) -> None:
        self._wake_scheduled = False
        waiting, self.waiting = self.waiting, {}
        for holder in waiting:
            holder.retry_credit()
