"""The write load the store benchmarks share: one serial writer, then eight at once."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gcs.store import WriteBatch

__all__ = ["Figures", "write_load"]


@dataclass(frozen=True, slots=True)
class Figures:
    p50_s: float
    """Serial write latency, median."""
    p99_s: float
    rate_per_s: float
    """Batches per second with ``concurrency`` writers."""
    cpu_per_batch_s: float
    """Process CPU per batch over both phases (counts driver threads too)."""


async def write_load(
    write: Callable[[WriteBatch], Awaitable[None]],
    batch: Callable[[int], WriteBatch],
    seconds: float,
    *,
    concurrency: int = 8,
) -> Figures:
    """``seconds`` of one writer, then ``seconds`` of ``concurrency`` writers; ``batch(n)``
    builds the n-th batch (distinct n across writers)."""
    cpu_started = time.process_time()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        await write(batch(len(latencies)))
        latencies.append(time.perf_counter() - started)
    done = 0
    deadline = time.perf_counter() + seconds

    async def writer(worker: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < deadline:
            await write(batch(1_000_000 * (worker + 1) + i))
            i += 1
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(concurrency)))
    rate = done / (time.perf_counter() - started)
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    cpu = (time.process_time() - cpu_started) / max(1, len(latencies) + done)
    return Figures(cuts[49], cuts[98], rate, cpu)
