"""Batch-write latency and throughput of each store backend (not part of the test suite).

    python bench/store/run.py [--seconds 2] [--batch 10] [--concurrency 8]

For each backend (memory, SQLite file, private PostgreSQL, private Redis with
appendfsync always) it runs two bounded phases on a fresh namespace:

* serial: one writer, one batch at a time → p50 / p99 latency of an acknowledged write;
* concurrent: ``--concurrency`` writers → batches/s.

Batches put ``--batch`` keys of 200 bytes each into one table (like a node-table update).
Compare two runs by running both on the same idle machine; numbers on a shared 2-core box are
noisy (a few %).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bench.store.load import write_load
from gcs.store import Store, WriteBatch
from gcs.store.memory import MemoryStore
from gcs.store.redis.store import RedisStore
from gcs.store.sql.store import SqlStore
from gcs.testing.postgres import postgres_server
from gcs.testing.redis_server import redis_server

VALUE = b"x" * 200


def _batch(seq: int, size: int) -> WriteBatch:
    batch = WriteBatch()
    for j in range(size):
        batch.put("NODE", f"{seq}-{j}".encode(), VALUE)
    return batch


async def _bench(name: str, make: Callable[[], Store], args: argparse.Namespace) -> None:
    store = make()
    await store.open()
    try:
        figures = await write_load(
            store.write,
            lambda seq: _batch(seq, args.batch),
            args.seconds,
            concurrency=args.concurrency,
        )
    finally:
        await store.close()
    print(
        f"{name:10s} serial p50={figures.p50_s * 1e3:7.3f} ms "
        f"p99={figures.p99_s * 1e3:7.3f} ms | x{args.concurrency} "
        f"{figures.rate_per_s:9.0f} batches/s"
    )


async def main(args: argparse.Namespace) -> None:
    print(f"batch of {args.batch} puts x 200 B, {args.seconds}s per phase")
    await _bench("memory", MemoryStore, args)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        await _bench("sqlite", lambda: SqlStore(url, namespace="bench"), args)
    with postgres_server(fsync=True) as pg:
        await _bench("postgres", lambda: SqlStore(pg.url(), namespace="bench"), args)
    with redis_server(appendfsync="always") as redis:
        await _bench("redis", lambda: RedisStore(redis.url, namespace="bench"), args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    asyncio.run(main(parser.parse_args()))
