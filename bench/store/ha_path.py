"""The price of ``--ha`` on the store: fenced writes that feed the change stream, and how
fast a blocked standby sees a write.

    python bench/store/ha_path.py [--rounds 5] [--seconds 1] [--backends redis,postgres,sqlite]
        [--changes 300] [--appendfsync always|no]

1. **HA write overhead** per backend (private redis-server, appendfsync ``always`` unless
   ``--appendfsync no`` takes its disk out of a noisy comparison; private
   PostgreSQL, a SQLite file): the same store without ``ha`` and with ``ha`` (holding the
   lease, fenced at its epoch), alternating rounds on fresh namespaces: serial ``write`` of
   10 puts x 200 B (p50 / p99), x8 concurrent batches/s, process CPU per batch.  Ratios
   are ha / plain (medians over rounds).
2. **Change latency**: a standby's store object blocks in ``read_changes``; the leader
   writes ``--changes`` batches one at a time.  Per batch: write start → the standby has
   it (p50 / p99), and the writer's own acknowledgement for comparison.

Prints the load average; figures on a shared 2-core machine are noisy: compare ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bench.store.load import Figures, write_load
from gcs.store import Store, WriteBatch
from gcs.store.ha import HaStore
from gcs.store.redis.store import RedisStore
from gcs.store.sql.store import SqlStore
from gcs.testing.postgres import postgres_server
from gcs.testing.redis_server import redis_server

VALUE = b"x" * 200
TTL_MS = 600_000


def _batch(seq: int) -> WriteBatch:
    batch = WriteBatch()
    for j in range(10):
        batch.put("NODE", f"{seq}-{j}".encode(), VALUE)
    return batch


Factory = Callable[[str, bool], Store]


def _factories(
    names: list[str], stack: ExitStack, appendfsync: str
) -> Iterator[tuple[str, Factory]]:
    for name in names:
        if name == "redis":
            url = stack.enter_context(redis_server(appendfsync=appendfsync)).url
            yield name, lambda ns, ha, url=url: RedisStore(url, namespace=ns, ha=ha)
        elif name == "postgres":
            url = stack.enter_context(postgres_server()).url()
            yield name, lambda ns, ha, url=url: SqlStore(url, namespace=ns, ha=ha)
        elif name == "sqlite":
            path = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "ha.db")
            yield name, lambda ns, ha, p=path: SqlStore(f"sqlite:///{p}", namespace=ns, ha=ha)
        else:
            raise SystemExit(f"unknown backend {name!r}")


async def _open(make: Factory, ha: bool) -> Store:
    store = make(f"b{uuid.uuid4().hex[:10]}", ha)
    await store.open()
    if ha:
        assert isinstance(store, HaStore)
        epoch = await store.try_acquire_lease("bench", TTL_MS)
        assert epoch is not None
        store.fence(epoch)
    return store


async def overhead(name: str, make: Factory, args: argparse.Namespace) -> None:
    figures: dict[str, list[Figures]] = {"plain": [], "ha": []}
    for round_ in range(args.rounds):
        order = ["plain", "ha"] if round_ % 2 == 0 else ["ha", "plain"]
        for kind in order:
            store = await _open(make, kind == "ha")
            try:
                figures[kind].append(await write_load(store.write, _batch, args.seconds))
            finally:
                await store.close()
    medians = {
        kind: [statistics.median(getattr(f, attr) for f in rounds) for attr in Figures.__slots__]
        for kind, rounds in figures.items()
    }
    for kind, (p50, p99, rate, cpu) in medians.items():
        print(
            f"  {name:8s} {kind:5s} serial p50 {p50 * 1e3:6.3f} ms p99 {p99 * 1e3:7.3f} ms"
            f" | x8 {rate:6.0f}/s | CPU/batch {cpu * 1e6:5.0f} us"
        )
    plain, ha = medians["plain"], medians["ha"]
    print(
        f"  {name:8s} ha/plain: p50 x{ha[0] / plain[0]:.2f}  p99 x{ha[1] / plain[1]:.2f}"
        f"  x8 rate x{ha[2] / plain[2]:.2f}  CPU/batch x{ha[3] / plain[3]:.2f}",
        flush=True,
    )


async def change_latency(name: str, make: Factory, args: argparse.Namespace) -> None:
    leader = await _open(make, True)
    standby = make(getattr(leader, "namespace", ""), True)
    await standby.open()
    assert isinstance(leader, HaStore) and isinstance(standby, HaStore)
    seen: dict[int, float] = {}
    started: dict[int, float] = {}
    acked: dict[int, float] = {}
    done, arrived = asyncio.Event(), asyncio.Event()

    async def follow() -> None:
        cursor = await standby.change_cursor()
        while len(seen) < args.changes:
            cursor, changes = await standby.read_changes(cursor, block_ms=5000)
            now = time.perf_counter()
            for change in changes:
                seq = int(change.key.split(b"-", 1)[0])
                seen.setdefault(seq, now)
            arrived.set()
        done.set()

    reader = asyncio.create_task(follow())
    try:
        await asyncio.sleep(0.2)  # the standby is blocked before the first write
        for seq in range(args.changes):
            started[seq] = time.perf_counter()
            await leader.write(_batch(seq))
            acked[seq] = time.perf_counter()
            while seq not in seen:  # one write in flight at a time: the standby's view
                arrived.clear()
                await arrived.wait()
        await done.wait()
    finally:
        reader.cancel()
        await leader.close()
        await standby.close()
    delivered = sorted(seen[s] - started[s] for s in started)
    acks = sorted(acked[s] - started[s] for s in started)
    cuts, ack_cuts = statistics.quantiles(delivered, n=100), statistics.quantiles(acks, n=100)
    print(
        f"  {name:8s} write start -> standby has it p50 {cuts[49] * 1e3:6.3f} ms"
        f" p99 {cuts[98] * 1e3:7.3f} ms | writer's ack p50 {ack_cuts[49] * 1e3:6.3f} ms"
        f" p99 {ack_cuts[98] * 1e3:7.3f} ms",
        flush=True,
    )


async def main(args: argparse.Namespace) -> None:
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    with ExitStack() as stack:
        backends = list(_factories(names, stack, args.appendfsync))
        print(f"== HA write overhead ({args.rounds} rounds x {args.seconds} s, medians) ==")
        for name, make in backends:
            await overhead(name, make, args)
        print(f"== change latency ({args.changes} batches, one at a time) ==")
        for name, make in backends:
            await change_latency(name, make, args)
    print("load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--backends", default="redis,postgres,sqlite")
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--appendfsync", choices=["always", "no"], default="always")
    asyncio.run(main(parser.parse_args()))
