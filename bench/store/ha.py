"""Redis high availability: the price of WAIT, and a Sentinel failover under writes.

    python bench/store/ha.py [--seconds 2] [--rounds 3] [--writers 8]

1. **WAIT**: a master with one replica (appendfsync always on both); the same store options
   with ``wait_replicas=0`` and with the default (one replica whenever the master has one),
   alternating rounds: serial write p50 / p99 and x8 batches/s of 10 puts x 200 B.
2. **Failover**: a master, one replica and three sentinels (down-after 1000 ms,
   failover-timeout 3000 ms).  ``--writers`` InternalKV clients create unique keys through
   one store while the master is killed with SIGKILL.  Per round: the sentinel failover
   time (kill → the sentinels name the new master), the time until writes resume (kill →
   first write acknowledged after it) and the gap between the two (target: resume within
   failover + 2 s), answers during the outage by kind, and acknowledged writes lost (every
   acknowledged key is read back from the new master; target 0).  Concurrent InternalKV
   clients on hot keys run alongside and their history is checked for linearizability.

Prints the load average; figures on a shared 2-core machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bench.store.load import Figures, write_load
from gcs.managers.kv import KvManager
from gcs.store import StoreUnavailable, WriteBatch
from gcs.store.redis.store import RedisOptions, RedisStore
from gcs.testing.linearizability import AckedWrites, History, Workload, check
from gcs.testing.redis_sentinels import RedisSentinels

VALUE = b"x" * 200


def _batch(seq: int) -> WriteBatch:
    batch = WriteBatch()
    for j in range(10):
        batch.put("NODE", f"{uuid.uuid4().hex}-{seq}-{j}".encode(), VALUE)
    return batch


async def wait_cost(args: argparse.Namespace) -> None:
    print("== WAIT: write latency with and without replica acknowledgement ==")
    deployment = RedisSentinels(sentinels=0).start()
    try:
        url = deployment.nodes[0].url
        stores = {
            "no WAIT": RedisStore(url, namespace="b", options=RedisOptions(wait_replicas=0)),
            "WAIT 1": RedisStore(url, namespace="b", options=RedisOptions()),
        }
        for store in stores.values():
            await store.open()
        figures: dict[str, list[Figures]] = {name: [] for name in stores}
        for _ in range(args.rounds):
            for name, store in stores.items():
                figures[name].append(await write_load(store.write, _batch, args.seconds))
        for store in stores.values():
            await store.close()
    finally:
        deployment.cleanup()
    medians = {
        name: (
            statistics.median(f.p50_s for f in rounds),
            statistics.median(f.p99_s for f in rounds),
            statistics.median(f.rate_per_s for f in rounds),
        )
        for name, rounds in figures.items()
    }
    for name, (p50, p99, rate) in medians.items():
        print(
            f"  {name:8s} serial p50 {p50 * 1e3:6.3f} ms  p99 {p99 * 1e3:7.3f} ms  x8 {rate:6.0f}/s"
        )
    base, waited = medians["no WAIT"], medians["WAIT 1"]
    print(
        f"  WAIT/no WAIT: p50 x{waited[0] / base[0]:.2f}, p99 x{waited[1] / base[1]:.2f}, "
        f"x8 throughput x{waited[2] / base[2]:.2f}"
    )


class _MasterWatch:
    """Polls the sentinels from a thread: when do they name another master?"""

    def __init__(self, deployment: RedisSentinels, old_port: int) -> None:
        self.deployment = deployment
        self.old_port = old_port
        self.switched_at: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = threading.Event()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and self.switched_at is None:
            try:
                if self.deployment.master_address()[1] != self.old_port:
                    self.switched_at = time.monotonic()
            except RuntimeError:
                pass
            self._stop.wait(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


async def failover_round(args: argparse.Namespace, round_: int) -> dict[str, float]:
    deployment = RedisSentinels(down_after_ms=1000, failover_timeout_ms=3000).start()
    options = RedisOptions(socket_timeout_s=2.0, connect_timeout_s=1.0, wait_timeout_ms=2000)
    store = RedisStore(deployment.url, namespace=f"ha{round_}", options=options)
    await store.open()
    kv = KvManager(store)
    old = deployment.master()
    writes = AckedWrites(kv, failed_if=lambda e: isinstance(e, StoreUnavailable))
    killed_at: float | None = None
    first_ack_after: float | None = None
    stop_at: float | None = None
    watch: _MasterWatch | None = None
    warmed_up = asyncio.Event()

    def stop() -> bool:
        return stop_at is not None and time.monotonic() >= stop_at

    async def writer(worker: int) -> None:
        nonlocal first_ack_after, stop_at
        for i in itertools.count():
            if stop():
                return
            started = time.monotonic()
            if not await writes.write(worker * 10**9 + i):
                continue
            if len(writes.acked) >= 200:
                warmed_up.set()
            if killed_at is not None and started > killed_at and first_ack_after is None:
                first_ack_after = time.monotonic()
                stop_at = first_ack_after + 1.0

    async def killer() -> None:
        nonlocal killed_at, watch
        await warmed_up.wait()
        watch = _MasterWatch(deployment, old.port)
        old.stop(kill=True)
        killed_at = time.monotonic()

    history = History()
    workload = Workload(clients=4, keys=6, delete_keys=2, seed=round_)
    try:
        await asyncio.gather(
            killer(),
            *(writer(w) for w in range(args.writers)),
            workload.run(
                kv, history, stop=stop, failed_if=lambda e: isinstance(e, StoreUnavailable)
            ),
        )
        await workload.read_back(kv, history)
        assert watch is not None and killed_at is not None and first_ack_after is not None
        watch.close()
        new = deployment.master()
        with new.client() as raw:
            lost = len(writes.lost(raw.hgetall(store._hash("KV"))))
    finally:
        await store.close()
        deployment.cleanup()
    failover = (watch.switched_at or first_ack_after) - killed_at
    resumed = first_ack_after - killed_at
    verdict = check(history.operations)
    print(
        f"  round {round_}: sentinel failover {failover:5.2f} s, writes resumed {resumed:5.2f} s "
        f"(+{resumed - failover:4.2f} s), acked {len(writes.acked)}, lost {lost}; "
        f"{writes.refused} nothing-written, {writes.unknown} may-have-been-applied; "
        f"KV history ({len(history.operations)} ops) "
        f"{'linearizable' if verdict.ok else 'NOT LINEARIZABLE'}"
    )
    if not verdict.ok:
        print(verdict)
    return {"failover": failover, "resumed": resumed, "lost": lost}


async def failover(args: argparse.Namespace) -> None:
    print(
        f"== Sentinel failover under {args.writers} writers "
        "(down-after 1000 ms, failover-timeout 3000 ms) =="
    )
    results = [await failover_round(args, r) for r in range(args.rounds)]
    worst_gap = max(r["resumed"] - r["failover"] for r in results)
    print(
        f"  median failover {statistics.median(r['failover'] for r in results):.2f} s, "
        f"median resume {statistics.median(r['resumed'] for r in results):.2f} s, worst "
        f"resume - failover {worst_gap:.2f} s (target <= 2 s), acknowledged writes lost "
        f"{sum(int(r['lost']) for r in results)} (target 0)"
    )


async def main(args: argparse.Namespace) -> None:
    await wait_cost(args)
    await failover(args)
    print("load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=8)
    asyncio.run(main(parser.parse_args()))
