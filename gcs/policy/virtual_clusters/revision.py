"""Revision numbers: strictly increasing, also across restarts."""

from __future__ import annotations

from collections.abc import Callable


class RevisionSource:
    """Hands out ``max(now_ns(), last + 1)``.

    ant-ray uses the wall clock in ns; we keep that shape (clients see ns-like values) but
    never repeat or go back: after a restart ``observe`` every stored revision first.
    ``now_ns`` is injected (the caller's clock); this object reads no clock itself.
    """

    def __init__(self, now_ns: Callable[[], int], floor: int = 0) -> None:
        self._now_ns = now_ns
        self._last = floor

    @property
    def last(self) -> int:
        return self._last

    def observe(self, revision: int) -> None:
        self._last = max(self._last, revision)

    def next(self) -> int:
        self._last = max(self._now_ns(), self._last + 1)
        return self._last
