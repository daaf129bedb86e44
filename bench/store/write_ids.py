"""Cost of definite answers (write ids) on the write path, as same-process A/B ratios.

    python bench/store/write_ids.py [--seconds 1] [--rounds 3]

For SQLite and Redis, alternates rounds of the current write path ("ids") with the same
store minus the write-id work ("base"): SQL without the ``gcs_writes`` insert, Redis through
redis-py's ``Script`` call (the previous path: no sent/not-sent tracking, no stale check).
Prints process CPU per batch (the figure that survives a loaded machine: it counts the
driver threads too), serial p50 and x8 batches/s of each, with ratios ids/base.  Latency
and throughput are noisy on a shared box.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bench.store.load import write_load
from gcs.store import WriteBatch
from gcs.store.redis import scripts as redis_scripts
from gcs.store.redis.store import RedisStore
from gcs.store.sql.store import SqlStore
from gcs.testing.redis_server import redis_server

VALUE = b"x" * 200
Write = Callable[[WriteBatch], Awaitable[None]]


_UNIQUE = itertools.count()


def _batch(seq: int) -> WriteBatch:
    """Fresh keys every time: a batch that changes nothing costs SQLite no fsync, which
    would flatter whichever variant happens to rewrite old keys."""
    batch = WriteBatch()
    for j in range(10):
        batch.put("NODE", f"{next(_UNIQUE)}-{seq}-{j}".encode(), VALUE)
    return batch


async def _round(write: Write, seconds: float) -> tuple[float, float, float]:
    figures = await write_load(write, _batch, seconds)
    return figures.p50_s, figures.rate_per_s, figures.cpu_per_batch_s


async def _ab(name: str, ids: Write, base: Write, args: argparse.Namespace) -> None:
    figures: dict[str, list[tuple[float, float, float]]] = {"ids": [], "base": []}
    for _ in range(args.rounds):
        figures["base"].append(await _round(base, args.seconds))
        figures["ids"].append(await _round(ids, args.seconds))
    p50 = {k: statistics.median(f[0] for f in v) for k, v in figures.items()}
    rate = {k: statistics.median(f[1] for f in v) for k, v in figures.items()}
    cpu = {k: statistics.median(f[2] for f in v) for k, v in figures.items()}
    print(
        f"{name:7s} CPU/batch base {cpu['base'] * 1e6:6.0f} us ids {cpu['ids'] * 1e6:6.0f} us "
        f"(x{cpu['ids'] / cpu['base']:.2f}) | serial p50 base {p50['base'] * 1e3:6.2f} ms "
        f"ids {p50['ids'] * 1e3:6.2f} ms (x{p50['ids'] / p50['base']:.2f}) | x8 base "
        f"{rate['base']:5.0f}/s ids {rate['ids']:5.0f}/s (x{rate['ids'] / rate['base']:.2f})"
    )


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlStore(f"sqlite:///{tmp}/bench.db")
        await store.open()
        record = store._record_write

        async def no_record(_conn: object, _write_id: bytes) -> None:
            return None

        async def sql_ids(batch: WriteBatch) -> None:
            store._record_write = record  # type: ignore[method-assign]
            await store.write(batch)

        async def sql_base(batch: WriteBatch) -> None:
            store._record_write = no_record  # type: ignore[method-assign,assignment]
            await store.write(batch)

        try:
            await _ab("sqlite", sql_ids, sql_base, args)
        finally:
            await store.close()
    with redis_server() as server:
        rstore = RedisStore(server.url, namespace="bench")
        await rstore.open()
        assert rstore.topology is not None
        script = rstore.topology.client.register_script(redis_scripts.BATCH)

        async def redis_base(batch: WriteBatch) -> None:
            args_: list[object] = [300, 0, 0, len(batch.puts), 0]
            for _table, key, value in batch.puts:
                args_ += [2, key, value]
            await script(keys=[rstore._write_marker(batch.write_id), b"RAYbench@NODE"], args=args_)

        try:
            await _ab("redis", rstore.write, redis_base, args)
        finally:
            await rstore.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
