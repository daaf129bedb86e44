"""Copy-on-write membership values, so planning a move never copies a 10,000-node cluster.

``Members`` is an immutable node id -> bucket mapping: a base dict shared by every version
derived from it, plus a small overlay of changes. ``moved`` costs O(overlay + change) and folds
the overlay into a fresh base once it outgrows ~2·sqrt(size), so a move is amortised
O(sqrt(size)) instead of O(size); discarded plans leave older versions untouched.

``UndividedIndex`` (template -> frozenset of undivided member ids, dead ones included) lets a
pick look at one template's candidates only. It is derived per move for the touched templates
(a node id's template never changes), so it stays consistent with the members it describes.
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping
from math import isqrt
from typing import Final

from gcs.policy.virtual_clusters.ids import UNDIVIDED

UndividedIndex = Mapping[str, frozenset[str]]
TemplateOf = Callable[[str], str]

_MISSING: Final = object()


class Members(Mapping[str, str]):
    """node id -> bucket; never mutated after construction (derive with ``moved``)."""

    __slots__ = ("_base", "_changes", "_len")

    def __init__(self, base: dict[str, str], changes: dict[str, str | None], length: int) -> None:
        self._base = base
        self._changes = changes
        """node id -> new bucket, or ``None`` = removed; overrides ``_base``."""
        self._len = length

    @classmethod
    def of(cls, members: Mapping[str, str]) -> Members:
        """``members`` itself when already a ``Members``, else a private copy of it."""
        if isinstance(members, Members):
            return members
        return cls(dict(members), {}, len(members))

    # -- Mapping
    def get(self, key: str, default: object = None) -> str | None:  # type: ignore[override]
        found = self._changes.get(key, _MISSING)
        if found is _MISSING:
            return self._base.get(key, default)  # type: ignore[arg-type]
        return default if found is None else found  # type: ignore[return-value]

    def __getitem__(self, key: str) -> str:
        found = self.get(key, _MISSING)
        if found is _MISSING:
            raise KeyError(key)
        return found  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        return self.get(key, _MISSING) is not _MISSING  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        changes = self._changes
        if not changes:
            yield from self._base
            return
        for node_id in self._base:
            if node_id not in changes:
                yield node_id
        for node_id, bucket in changes.items():
            if bucket is not None:
                yield node_id

    def items(self) -> _Items:  # type: ignore[override]
        return _Items(self)

    def __repr__(self) -> str:
        return f"Members({dict(self.items())!r})"

    # -- derivation
    def moved(self, add: Mapping[str, str], remove: Iterable[str]) -> Members:
        """A new version: ``remove`` first, then ``add`` (``add`` wins)."""
        base = self._base
        changes = dict(self._changes)
        length = self._len
        for node_id in remove:
            current = changes.get(node_id, _MISSING)
            if current is _MISSING:
                current = base.get(node_id)
            if current is None:
                continue
            length -= 1
            if node_id in base:
                changes[node_id] = None
            else:
                del changes[node_id]
        for node_id, bucket in add.items():
            current = changes.get(node_id, _MISSING)
            if current is _MISSING:
                current = base.get(node_id)
            if current is None:
                length += 1
            changes[node_id] = bucket
        if len(changes) > 64 + 2 * isqrt(len(base)):
            return Members(_fold(base, changes), {}, length)
        return Members(base, changes, length)


class _Items(ItemsView[str, str]):
    """``items()`` of a ``Members`` without a lookup per entry."""

    _mapping: Members

    def __iter__(self) -> Iterator[tuple[str, str]]:
        members = self._mapping
        changes = members._changes
        if not changes:
            yield from members._base.items()
            return
        for node_id, bucket in members._base.items():
            if node_id not in changes:
                yield node_id, bucket
        for node_id, changed in changes.items():
            if changed is not None:
                yield node_id, changed


def _fold(base: dict[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    folded = dict(base)
    for node_id, bucket in changes.items():
        if bucket is None:
            folded.pop(node_id, None)
        else:
            folded[node_id] = bucket
    return folded


def build_index(members: Mapping[str, str], template: TemplateOf) -> dict[str, frozenset[str]]:
    groups: dict[str, set[str]] = {}
    for node_id, bucket in members.items():
        if bucket == UNDIVIDED:
            groups.setdefault(template(node_id), set()).add(node_id)
    return {t: frozenset(ids) for t, ids in groups.items()}


def moved_index(
    index: UndividedIndex,
    before: Mapping[str, str],
    after: Mapping[str, str],
    touched: Iterable[str],
    template: TemplateOf,
) -> UndividedIndex:
    """``index`` (of ``before``) updated to describe ``after``, which differs from ``before``
    only at ``touched`` ids; copies only the templates whose undivided set changed."""
    gone: dict[str, set[str]] = {}
    came: dict[str, set[str]] = {}
    for node_id in touched:
        was = before.get(node_id) == UNDIVIDED
        now = after.get(node_id) == UNDIVIDED
        if was != now:
            (came if now else gone).setdefault(template(node_id), set()).add(node_id)
    if not (gone or came):
        return index
    updated = dict(index)
    for name in gone.keys() | came.keys():
        ids = (
            updated.get(name, frozenset()).difference(gone.get(name, ())).union(came.get(name, ()))
        )
        if ids:
            updated[name] = ids
        else:
            updated.pop(name, None)
    return updated
