"""Cost of the apply lane per mutation, as a ratio against a bare write + apply.

    python -m bench.gcs.lane_overhead [--mutations 20000]

Both loops write one small batch to a MemoryStore and apply a dict update; the lane adds
its lock, the ambiguous-write bookkeeping and the task that keeps a cancelled caller from
cutting a mutation in half.  Reads never take the lane, so they are not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from gcs.base.clock import SystemClock
from gcs.managers.lane import ApplyLane
from gcs.store import WriteBatch
from gcs.store.memory import MemoryStore


async def bare(store: MemoryStore, n: int) -> float:
    state: dict[bytes, bytes] = {}
    start = time.perf_counter()
    for i in range(n):
        key = i.to_bytes(4, "little")
        await store.write(WriteBatch().put("T", key, b"v"))
        state[key] = b"v"
    return time.perf_counter() - start


async def laned(store: MemoryStore, n: int) -> float:
    lane = ApplyLane(store, "bench", SystemClock())
    state: dict[bytes, bytes] = {}
    start = time.perf_counter()
    for i in range(n):
        key = i.to_bytes(4, "little")
        async with lane:
            await lane.commit(
                WriteBatch().put("T", key, b"v"), lambda k=key: state.__setitem__(k, b"v")
            )
    return time.perf_counter() - start


async def main(n: int) -> None:
    await bare(MemoryStore(), n // 10)  # warm up
    await laned(MemoryStore(), n // 10)
    rounds = [(await bare(MemoryStore(), n), await laned(MemoryStore(), n)) for _ in range(3)]
    base = min(r[0] for r in rounds)
    lane = min(r[1] for r in rounds)
    print(f"mutations={n} (best of 3)")
    print(f"bare write+apply: {base / n * 1e6:.1f} us/mutation")
    print(f"on the lane:      {lane / n * 1e6:.1f} us/mutation  ratio={lane / base:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mutations", type=int, default=20000)
    asyncio.run(main(parser.parse_args().mutations))
