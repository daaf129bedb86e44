"""Linearizability checking of key-value histories (tests and benchmarks).

A history is what concurrent clients saw: for each operation its invocation, its response
(or none) and its result.  It is linearizable when every operation can be given one point
between its invocation and its response at which it took effect, such that the results are
those of the sequential model applied in that order.  The model is InternalKV's, key by key:

* ``put(value, overwrite)`` → ``added``: the key was absent.  ``overwrite=False`` (put if
  absent) writes only then; ``overwrite=True`` always writes.
* ``get()`` → the value, or None;
* ``delete()`` → the number of keys removed (0 or 1).

Operations whose outcome is **unknown** (the client got "may have been applied") may or may
not have taken effect, at any time after their invocation: they have no response, and any
result is accepted.  Taking effect after every other operation is indistinguishable from
not taking effect, so an open-ended interval covers both.  Operations that **definitely
failed** (nothing was written) are left out.

Checking is per key (P-compositionality: single-key operations are linearizable exactly when
each key's sub-history is; Herlihy & Wing's locality), each by Wing & Gong's backtracking
search with Lowe's memo of (linearized set, state) pairs, as in Jepsen's Knossos and
Porcupine.  Time is a logical clock: one process records all events in the order they
happen, which is the real-time order the check needs.

The ``inject_*`` functions plant one fault in a recorded history that no valid execution
could produce; a checker that accepts the result is broken (tests use them to show the
check has teeth on real histories).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import itertools
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

__all__ = [
    "AckedWrites",
    "CheckResult",
    "History",
    "KeyViolation",
    "Kind",
    "KvClient",
    "Operation",
    "Workload",
    "check",
    "inject_lost_write",
    "inject_second_winner",
    "inject_stale_read",
]

T = TypeVar("T")


class Kind(enum.Enum):
    PUT = "put"
    GET = "get"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Operation:
    """One client operation on one key.  ``ret`` None: the outcome is unknown."""

    client: int
    key: bytes
    kind: Kind
    call: int
    ret: int | None
    result: Any = None
    """put: ``added`` (bool); get: the value (bytes) or None; delete: 0 or 1."""
    value: bytes | None = None
    """put: the value written."""
    overwrite: bool = True
    """put: False = put if absent."""

    @property
    def unknown(self) -> bool:
        return self.ret is None

    def describe(self) -> str:
        if self.kind is Kind.PUT:
            what = f"put{'' if self.overwrite else '-if-absent'}({self.value!r})"
        else:
            what = f"{self.kind.value}()"
        outcome = "?" if self.unknown else repr(self.result)
        end = "…" if self.ret is None else str(self.ret)
        return f"client {self.client} [{self.call}, {end}] {what} -> {outcome}"


# -- recording ----------------------------------------------------------------------------------


class History:
    """Records operations as concurrent clients run them (one event loop = one clock)."""

    def __init__(self) -> None:
        self._ticks = itertools.count()
        self.operations: list[Operation] = []
        self.failed = 0
        """Operations left out because they definitely did not take effect."""
        self.completed = 0
        """Operations answered (a result, neither failed nor unknown)."""
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    async def run(
        self,
        client: int,
        key: bytes,
        kind: Kind,
        action: Awaitable[T],
        *,
        value: bytes | None = None,
        overwrite: bool = True,
        failed_if: Callable[[BaseException], bool] = lambda _: False,
    ) -> T:
        """Await ``action`` and record it: its result, "failed" when ``failed_if(error)``
        says the error means nothing took effect, else "unknown".  Re-raises errors."""
        call = next(self._ticks)
        try:
            result = await action
        except BaseException as err:
            if failed_if(err):
                self.failed += 1
            else:
                self.operations.append(
                    Operation(client, key, kind, call, None, value=value, overwrite=overwrite)
                )
            raise
        self.operations.append(
            Operation(client, key, kind, call, next(self._ticks), result, value, overwrite)
        )
        self.completed += 1
        if self._waiters:
            self._wake()
        return result

    async def until_completed(self, count: int) -> None:
        """Until ``count`` operations in all have been answered (a workload's progress as
        a count of answers, not a stretch of wall time)."""
        if self.completed >= count:
            return
        done = asyncio.get_running_loop().create_future()
        self._waiters.append((count, done))
        await done

    def _wake(self) -> None:
        waiting = []
        for count, done in self._waiters:
            if done.done():
                continue
            if self.completed >= count:
                done.set_result(None)
            else:
                waiting.append((count, done))
        self._waiters = waiting

    def now(self) -> int:
        """A tick after every event recorded so far."""
        return next(self._ticks)


class KvClient(Protocol):
    """InternalKV as :class:`gcs.managers.kv.KvManager` offers it (a gRPC client can too)."""

    async def put(self, namespace: bytes, key: bytes, value: bytes, *, overwrite: bool) -> bool: ...

    async def get(self, namespace: bytes, key: bytes) -> bytes | None: ...

    async def delete(self, namespace: bytes, key: bytes, *, by_prefix: bool) -> int: ...


@dataclass(frozen=True, slots=True)
class Workload:
    """Concurrent InternalKV clients over a few hot keys, recorded into a :class:`History`.

    Keys ``k0 .. k<keys-1>``; only the first ``delete_keys`` of them see deletes, so the
    others keep the facts the ``inject_*`` faults rely on.  Every put writes a value no
    other put writes (``<client>-<n>``).  Each client picks put / put-if-absent / get /
    delete at random (seeded)."""

    clients: int = 8
    keys: int = 6
    delete_keys: int = 2
    namespace: bytes = b"linearizability"
    seed: int = 0

    async def run(
        self,
        kv: KvClient,
        history: History,
        *,
        stop: Callable[[], bool],
        failed_if: Callable[[BaseException], bool] = lambda _: False,
        on_error: Callable[[BaseException], Awaitable[None]] | None = None,
    ) -> None:
        """Run every client until ``stop()``; errors are recorded (then ``on_error``)."""
        await asyncio.gather(
            *(self._client(c, kv, history, stop, failed_if, on_error) for c in range(self.clients))
        )

    async def _client(
        self,
        client: int,
        kv: KvClient,
        history: History,
        stop: Callable[[], bool],
        failed_if: Callable[[BaseException], bool],
        on_error: Callable[[BaseException], Awaitable[None]] | None,
    ) -> None:
        rng = random.Random(self.seed * 1_000_003 + client)
        ns = self.namespace
        for n in itertools.count():
            if stop():
                return
            index = rng.randrange(self.keys)
            key = f"k{index}".encode()
            choice = rng.random()
            value = f"{client}-{n}".encode()
            try:
                if choice < 0.3:
                    await history.run(
                        client, key, Kind.PUT, kv.put(ns, key, value, overwrite=True),
                        value=value, failed_if=failed_if,
                    )  # fmt: skip
                elif choice < 0.55:
                    await history.run(
                        client, key, Kind.PUT, kv.put(ns, key, value, overwrite=False),
                        value=value, overwrite=False, failed_if=failed_if,
                    )  # fmt: skip
                elif choice < 0.9 or index >= self.delete_keys:
                    await history.run(client, key, Kind.GET, kv.get(ns, key), failed_if=failed_if)
                else:
                    await history.run(
                        client, key, Kind.DELETE, kv.delete(ns, key, by_prefix=False),
                        failed_if=failed_if,
                    )  # fmt: skip
            except Exception as err:  # recorded by history.run
                if on_error is not None:
                    await on_error(err)

    async def read_back(
        self,
        kv: KvClient,
        history: History,
        *,
        failed_if: Callable[[BaseException], bool] = lambda _: False,
    ) -> None:
        """One more read of every key, after everything else (what survived)."""
        for index in range(self.keys):
            key = f"k{index}".encode()
            await history.run(-1, key, Kind.GET, kv.get(self.namespace, key), failed_if=failed_if)


@dataclass
class AckedWrites:
    """Keys only this writer creates (InternalKV put-if-absent, ``u<n>`` = ``v<n>``), and
    which of them were acknowledged: after a failover every acknowledged one must be there."""

    kv: KvClient
    namespace: bytes = b"acked"
    failed_if: Callable[[BaseException], bool] = lambda _: False
    acked: dict[bytes, bytes] = field(default_factory=dict)
    refused: int = 0
    """Writes answered "nothing was written"."""
    unknown: int = 0
    """Writes answered "may have been applied" (or any other error)."""

    async def write(self, n: int) -> bool:
        """Create key ``u<n>``; True when acknowledged.  Errors are counted, not raised."""
        key, value = b"u%d" % n, b"v%d" % n
        try:
            await self.kv.put(self.namespace, key, value, overwrite=False)
        except Exception as err:
            if self.failed_if(err):
                self.refused += 1
            else:
                self.unknown += 1
            return False
        self.acked[key] = value
        return True

    def lost(self, stored: dict[bytes, bytes]) -> list[bytes]:
        """Acknowledged keys missing from ``stored``: the KV table's raw fields (as a
        Redis hash of the store holds them) -> values."""
        from gcs.managers.kv import encode_key

        return sorted(
            k for k, v in self.acked.items() if stored.get(encode_key(self.namespace, k)) != v
        )


# -- checking ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyViolation:
    """Why one key's history is not linearizable."""

    key: bytes
    operations: int
    linearized: tuple[Operation, ...]
    """The longest order the search found that explains a prefix of the history."""
    stuck: tuple[Operation, ...]
    """Operations that could not come next after it (the first must precede a response)."""

    def __str__(self) -> str:
        lines = [
            f"key {self.key!r}: no linearization of {self.operations} operations; the "
            f"longest explains {len(self.linearized)}:",
            *(f"  {op.describe()}" for op in self.linearized[-8:]),
            "then none of these can take effect:",
            *(f"  {op.describe()}" for op in self.stuck[:8]),
        ]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class CheckResult:
    keys: int
    operations: int
    violations: tuple[KeyViolation, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.violations

    def __str__(self) -> str:
        if self.ok:
            return f"linearizable: {self.operations} operations on {self.keys} keys"
        return "\n".join(str(v) for v in self.violations)


def check(operations: Iterable[Operation]) -> CheckResult:
    """Whether the history is linearizable, key by key."""
    by_key: dict[bytes, list[Operation]] = defaultdict(list)
    total = 0
    for op in operations:
        by_key[op.key].append(op)
        total += 1
    violations = [v for ops in by_key.values() if (v := _check_key(ops)) is not None]
    return CheckResult(len(by_key), total, tuple(violations))


def _step(state: bytes | None, op: Operation) -> tuple[bool, bytes | None]:
    """The sequential model: (result matches, next state)."""
    if op.kind is Kind.GET:
        return op.unknown or op.result == state, state
    if op.kind is Kind.PUT:
        added = state is None
        written = op.value if (op.overwrite or added) else state
        return op.unknown or op.result == added, written
    deleted = 0 if state is None else 1
    return op.unknown or op.result == deleted, None


@dataclass(slots=True, eq=False)
class _Entry:
    op: int
    is_call: bool
    time: float
    match: _Entry | None = None
    prev: _Entry | None = None
    next: _Entry | None = None


def _entries(ops: Sequence[Operation]) -> _Entry:
    """The call / return events as a doubly linked list behind a sentinel head."""
    events: list[_Entry] = []
    for index, op in enumerate(ops):
        call = _Entry(index, True, op.call)
        ret = _Entry(index, False, float("inf") if op.ret is None else op.ret)
        call.match = ret
        events += [call, ret]
    # at one instant returns go first: an operation that ended when another began precedes it
    events.sort(key=lambda e: (e.time, e.is_call))
    head = _Entry(-1, False, float("-inf"))
    previous = head
    for event in events:
        previous.next, event.prev = event, previous
        previous = event
    return head


def _lift(entry: _Entry) -> None:
    """Take a call and its return out of the list."""
    assert entry.prev is not None and entry.match is not None
    entry.prev.next = entry.next
    if entry.next is not None:
        entry.next.prev = entry.prev
    ret = entry.match
    assert ret.prev is not None
    ret.prev.next = ret.next
    if ret.next is not None:
        ret.next.prev = ret.prev


def _unlift(entry: _Entry) -> None:
    """Put them back (exact inverse of :func:`_lift`, in reverse order)."""
    ret = entry.match
    assert ret is not None and ret.prev is not None and entry.prev is not None
    ret.prev.next = ret
    if ret.next is not None:
        ret.next.prev = ret
    entry.prev.next = entry
    if entry.next is not None:
        entry.next.prev = entry


def _check_key(ops: Sequence[Operation]) -> KeyViolation | None:
    head = _entries(ops)
    state: bytes | None = None
    linearized = 0
    stack: list[tuple[_Entry, bytes | None]] = []
    seen: set[tuple[int, bytes | None]] = set()
    best: list[int] = []
    best_stuck: list[int] = []
    entry = head.next
    while head.next is not None:
        assert entry is not None
        if entry.is_call:
            ok, after = _step(state, ops[entry.op])
            if ok:
                candidate = linearized | (1 << entry.op)
                if (candidate, after) not in seen:
                    seen.add((candidate, after))
                    stack.append((entry, state))
                    state, linearized = after, candidate
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            if len(stack) >= len(best):
                best = [e.op for e, _ in stack]
                best_stuck = _pending_calls(head, entry)
            if not stack:
                return KeyViolation(
                    ops[0].key,
                    len(ops),
                    tuple(ops[i] for i in best),
                    tuple(ops[i] for i in best_stuck),
                )
            top, state = stack.pop()
            linearized &= ~(1 << top.op)
            _unlift(top)
            entry = top.next
    return None


def _pending_calls(head: _Entry, upto: _Entry) -> list[int]:
    """Calls still in the list before the return ``upto`` (candidates that all failed)."""
    found: list[int] = []
    entry = head.next
    while entry is not None and entry is not upto:
        if entry.is_call:
            found.append(entry.op)
        entry = entry.next
    return [*found, upto.op]


# -- fault injection -------------------------------------------------------------------------------


def _keys_without_deletes(ops: Sequence[Operation]) -> Iterator[tuple[bytes, list[Operation]]]:
    by_key: dict[bytes, list[Operation]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    for key in sorted(by_key):
        key_ops = by_key[key]
        if not any(op.kind is Kind.DELETE for op in key_ops):
            yield key, key_ops


def _definitely_wrote(op: Operation) -> bool:
    return op.kind is Kind.PUT and not op.unknown and (op.overwrite or op.result is True)


def _end(ops: Sequence[Operation]) -> int:
    return 1 + max(max(op.call, op.ret or 0) for op in ops)


def inject_stale_read(ops: Sequence[Operation]) -> list[Operation]:
    """Add a read, after two acknowledged writes of one key, that returns the older value.

    Needs a key without deletes whose values are written once each (so the old value has
    one writer, which real time orders before the newer write)."""
    for key, key_ops in _keys_without_deletes(ops):
        writes = sorted((op for op in key_ops if _definitely_wrote(op)), key=lambda o: o.call)
        writers_of: dict[bytes | None, int] = defaultdict(int)
        for op in key_ops:
            if op.kind is Kind.PUT:
                writers_of[op.value] += 1
        for older, newer in itertools.combinations(writes, 2):
            assert older.ret is not None
            if older.ret < newer.call and writers_of[older.value] == 1:
                if older.value == newer.value:
                    continue
                at = _end(ops)
                stale = Operation(-1, key, Kind.GET, at, at + 1, older.value)
                return [*ops, stale]
    raise ValueError("no key with two acknowledged writes in real-time order and no deletes")


def inject_second_winner(ops: Sequence[Operation]) -> list[Operation]:
    """Turn a losing put-if-absent into a second winner (``added`` True twice, no delete
    between: the key went from absent to present twice)."""
    for _key, key_ops in _keys_without_deletes(ops):
        if not any(op.kind is Kind.PUT and not op.unknown and op.result is True for op in key_ops):
            continue
        for op in key_ops:
            if op.kind is Kind.PUT and not op.overwrite and not op.unknown and op.result is False:
                index = ops.index(op)
                return [*ops[:index], dataclasses.replace(op, result=True), *ops[index + 1 :]]
    raise ValueError("no key with a winning put and a losing put-if-absent and no deletes")


def inject_lost_write(ops: Sequence[Operation]) -> list[Operation]:
    """Add a read, after everything, that finds absent a key an acknowledged write created
    and nothing deleted."""
    for key, key_ops in _keys_without_deletes(ops):
        if any(_definitely_wrote(op) for op in key_ops):
            at = _end(ops)
            return [*ops, Operation(-1, key, Kind.GET, at, at + 1, None)]
    raise ValueError("no key with an acknowledged write and no deletes")
