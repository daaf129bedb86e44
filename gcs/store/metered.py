"""A store that times and counts what passes through it (``gcs_store_*`` metrics).

Wraps any :class:`Store`; the GCS hands the wrapped store to its managers.  Failures are
counted by what they mean for a client: ``unavailable`` (nothing written), ``full`` (nothing
written: the backend is out of memory or disk, an operator must act), ``unknown`` (may have
been written; resolved later), ``conflict`` (a compare-and-set lost), ``fenced`` (an HA
ex-leader's write refused: a newer lease epoch exists), ``error``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from gcs.store.base import Store, WriteBatch
from gcs.store.errors import StoreConflict, StoreFull, StoreOutcomeUnknown, StoreUnavailable
from gcs.store.ha import StoreFenced

__all__ = ["MeteredStore"]

R = TypeVar("R")
T = TypeVar("T")

_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 10)
"""Seconds; holds every bound of Ray's ``gcs_storage_operation_latency_ms`` (0.1 ms to
10 s), so :func:`latency_histograms` re-buckets exactly for the metrics agent."""


def _outcome(err: BaseException) -> str:
    if isinstance(err, StoreFenced):
        return "fenced"
    if isinstance(err, StoreOutcomeUnknown):
        return "unknown"
    if isinstance(err, StoreFull):
        return "full"
    if isinstance(err, StoreUnavailable):
        return "unavailable"
    if isinstance(err, StoreConflict):
        return "conflict"
    return "error"


class MeteredStore(Store):
    def __init__(self, inner: Store, registry: CollectorRegistry) -> None:
        self.inner = inner
        self.url = inner.url
        self._seconds = Histogram(
            "gcs_store_op_seconds",
            "Store operation latency",
            ["op"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self._failures = Counter(
            "gcs_store_failures",
            "Store operations that failed, by meaning",
            ["op", "outcome"],
            registry=registry,
        )
        self._batch_keys = Histogram(
            "gcs_store_batch_keys",
            "Keys written or deleted per batch",
            buckets=(1, 2, 5, 10, 100, 1000, 10000),
            registry=registry,
        )
        self._observe = {op: self._seconds.labels(op).observe for op in _OPS}

    def sharing(self, inner: Store) -> MeteredStore:
        """Another store counted in the same metrics (an HA member wraps each leader term's
        store; a registry takes each metric name once)."""
        twin = MeteredStore.__new__(MeteredStore)
        twin.inner, twin.url = inner, inner.url
        twin._seconds, twin._failures = self._seconds, self._failures
        twin._batch_keys, twin._observe = self._batch_keys, self._observe
        return twin

    def latency_histograms(self) -> dict[str, tuple[tuple[float, ...], tuple[float, ...], float]]:
        """``op -> (bucket bounds in s, cumulative counts with +Inf last, sum in s)``, for
        every operation that ran."""
        bounds: dict[str, list[float]] = {}
        counts: dict[str, list[float]] = {}
        sums: dict[str, float] = {}
        for family in self._seconds.collect():
            for sample in family.samples:
                op = sample.labels.get("op", "")
                if sample.name.endswith("_bucket"):
                    le = sample.labels["le"]
                    if le != "+Inf":
                        bounds.setdefault(op, []).append(float(le))
                    counts.setdefault(op, []).append(sample.value)
                elif sample.name.endswith("_sum"):
                    sums[op] = sample.value
        return {
            op: (tuple(bounds.get(op, ())), tuple(cumulative), sums.get(op, 0.0))
            for op, cumulative in counts.items()
            if cumulative and cumulative[-1]
        }

    async def _timed(self, op: str, call: Callable[[], Awaitable[R]]) -> R:
        start = time.perf_counter()
        try:
            return await call()
        except Exception as err:
            self._failures.labels(op, _outcome(err)).inc()
            raise
        finally:
            self._observe[op](time.perf_counter() - start)

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def get(self, table: str, key: bytes) -> bytes | None:
        return await self._timed("get", lambda: self.inner.get(table, key))

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        return await self._timed("multi_get", lambda: self.inner.multi_get(table, keys))

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return await self._timed("get_all", lambda: self.inner.get_all(table))

    def decoded_rows(self, table: str) -> Mapping[bytes, Any] | None:
        return self.inner.decoded_rows(table)

    def prepared(
        self, table: str, view: Callable[[Any], T], rows: Iterable[tuple[bytes, Any]]
    ) -> dict[bytes, T]:
        return self.inner.prepared(table, view, rows)

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        return await self._timed("scan_prefix", lambda: self.inner.scan_prefix(table, prefix))

    async def scan_keys(self, table: str, prefix: bytes, *, max_bytes: int) -> list[bytes] | None:
        return await self._timed(
            "scan_keys", lambda: self.inner.scan_keys(table, prefix, max_bytes=max_bytes)
        )

    async def write(self, batch: WriteBatch) -> None:
        self._batch_keys.observe(len(batch.puts) + len(batch.deletes))
        await self._timed("write", lambda: self.inner.write(batch))

    async def landed(self, write_id: bytes) -> bool:
        return await self._timed("landed", lambda: self.inner.landed(write_id))

    async def increment(self, counter: str, by: int = 1) -> int:
        return await self._timed("increment", lambda: self.inner.increment(counter, by))

    async def read_counter(self, counter: str) -> int:
        return await self._timed("read_counter", lambda: self.inner.read_counter(counter))


_OPS = (
    "get",
    "multi_get",
    "get_all",
    "scan_prefix",
    "scan_keys",
    "write",
    "landed",
    "increment",
    "read_counter",
)
