"""What every HA backend shares: argument checks, and the change stream's parts (what a
batch changes, its byte encoding, cursors).

Every backend numbers the batches of one namespace densely (1, 2, 3... : a counter bumped
in the same atomic step as the batch, so a refused or conflicting batch takes no number).
A cursor is that number in ASCII; "changes after cursor n" are batches n+1, n+2...  Dense
numbers make trimming visible without bookkeeping: a reader at n whose next retained batch
is not n+1 has lost changes (:func:`check_contiguous`).

One batch is stored as one blob (a Redis stream entry, a SQL row)::

    change := kind:u8 (0 put, 1 delete) · len:u16 · table · len:u32 · key
              [· len:u32 · value]                                    (put only)

big-endian, concatenated.  A counter's new value is a put in table ``""`` (the Redis
increment script builds the same bytes in Lua with ``struct.pack('>BHI4')``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from gcs.store.base import WriteBatch
from gcs.store.ha import Change, ChangeCursor, ChangesTrimmed

__all__ = [
    "batch_changes",
    "check_contiguous",
    "check_fence_epoch",
    "check_lease_args",
    "counter_change",
    "cursor_of",
    "decode_changes",
    "encode_batch",
    "encode_changes",
    "seq_of",
    "whole_batches",
]

_PUT, _DELETE = 0, 1
_HEAD = struct.Struct(">BHI")
_LEN = struct.Struct(">I")


def check_lease_args(holder: str, ttl_ms: int) -> None:
    if not holder:
        raise ValueError("a lease holder needs a non-empty name")
    if ttl_ms < 1:
        raise ValueError(f"lease ttl_ms must be >= 1, got {ttl_ms}")


def check_fence_epoch(epoch: int) -> int:
    if epoch < 1:
        raise ValueError(f"a lease epoch is >= 1, got {epoch}")
    return epoch


def batch_changes(batch: WriteBatch) -> list[Change]:
    """The final state of every key ``batch`` touches (puts apply before deletes, as every
    backend applies them), one change per key."""
    final: dict[tuple[str, bytes], bytes | None] = {}
    for table, key, value in batch.puts:
        final[(table, key)] = value
    for table, key in batch.deletes:
        final[(table, key)] = None
    return [Change(table, key, value) for (table, key), value in final.items()]


def counter_change(counter: str, value: int) -> Change:
    return Change("", counter.encode(), str(value).encode())


def encode_changes(changes: Iterable[Change]) -> bytes:
    return _encode((change.table, change.key, change.value) for change in changes)


def encode_batch(batch: WriteBatch) -> bytes:
    """``encode_changes(batch_changes(batch))`` without the Change objects (the HA write
    path of Redis and SQL: half the cost)."""
    final: dict[tuple[str, bytes], bytes | None] = {}
    for table, key, value in batch.puts:
        final[(table, key)] = value
    for table, key in batch.deletes:
        final[(table, key)] = None
    return _encode((table, key, value) for (table, key), value in final.items())


def _encode(changes: Iterable[tuple[str, bytes, bytes | None]]) -> bytes:
    parts: list[bytes] = []
    names: dict[str, bytes] = {}
    for table, key, value in changes:
        name = names.get(table)
        if name is None:
            name = names[table] = table.encode()
        if value is None:
            parts += (_HEAD.pack(_DELETE, len(name), len(key)), name, key)
        else:
            parts += (
                _HEAD.pack(_PUT, len(name), len(key)),
                name,
                key,
                _LEN.pack(len(value)),
                value,
            )
    return b"".join(parts)


def decode_changes(blob: bytes) -> list[Change]:
    """Inverse of :func:`encode_changes`; ValueError on bytes it cannot have produced."""
    changes: list[Change] = []
    view, at, end = memoryview(blob), 0, len(blob)
    try:
        while at < end:
            kind, table_len, key_len = _HEAD.unpack_from(view, at)
            at += _HEAD.size
            table = bytes(view[at : at + table_len]).decode()
            at += table_len
            key = bytes(view[at : at + key_len])
            at += key_len
            value: bytes | None = None
            if kind == _PUT:
                (value_len,) = _LEN.unpack_from(view, at)
                at += _LEN.size
                value = bytes(view[at : at + value_len])
                at += value_len
            elif kind != _DELETE:
                raise ValueError(f"unknown change kind {kind}")
            if at > end:
                raise ValueError("truncated change")
            changes.append(Change(table, key, value))
    except (struct.error, UnicodeDecodeError) as err:
        raise ValueError(f"undecodable change stream entry: {err}") from err
    return changes


def cursor_of(seq: int) -> ChangeCursor:
    return str(seq).encode()


def seq_of(cursor: ChangeCursor) -> int:
    """The batch number a cursor names; ValueError for bytes no store of ours handed out."""
    if not cursor.isdigit():
        raise ValueError(f"not a change cursor: {cursor[:40]!r}")
    return int(cursor)


def check_contiguous(after: int, last: int, first: int | None) -> None:
    """Raise ChangesTrimmed unless a reader at ``after`` misses nothing: ``last`` is the
    newest batch number, ``first`` the first retained one after ``after`` (None: none)."""
    if after > last:
        raise ChangesTrimmed(
            f"cursor {after} is past the newest change {last} (the store lost changes, or "
            "the cursor is another store's)"
        )
    if (first is None and after < last) or (first is not None and first != after + 1):
        raise ChangesTrimmed(
            f"changes after {after} were trimmed (next retained: {first}, newest: {last})"
        )


def whole_batches(
    batches: Sequence[tuple[int, Sequence[Change]]], after: int, limit: int
) -> tuple[ChangeCursor, list[Change]]:
    """Whole batches in order until adding one would pass ``limit`` changes (the first is
    always taken, however big), and the cursor after the last one taken."""
    changes: list[Change] = []
    last = after
    for seq, batch in batches:
        if changes and len(changes) + len(batch) > limit:
            break
        changes.extend(batch)
        last = seq
    return cursor_of(last), changes
