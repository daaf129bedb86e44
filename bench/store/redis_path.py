"""The ordinary single-Redis path: this checkout against another one, in the same run.

    python bench/store/redis_path.py --base /path/to/other/checkout [--rounds 5] [--seconds 1]
        [--appendfsync always|no]

e.g. ``git worktree add /tmp/base 40d8284 && (cd /tmp/base && python setup.py --protos-only)``.
Each round measures both checkouts, alternating which goes first, each in a fresh process
importing its own ``gcs`` against its own private redis-server (appendonly, no replica;
appendfsync ``always`` by default, ``no`` takes the disk out of a noisy comparison):
serial ``write`` of 10 puts x 200 B (p50 / p99), x8 concurrent batches/s, serial ``get``
p50, and process CPU per write (counts the driver too; the figure that survives a loaded
machine).  Prints per-round figures, medians and ratios this/base, and the load average.
Only the public API both checkouts share is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

_TREE_ENV = "GCS_BENCH_TREE"
HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VALUE = b"x" * 200


async def _measure(seconds: float, appendfsync: str) -> dict[str, float]:
    # Self-contained on purpose (not bench/store/load.py): it runs inside the other
    # checkout too, which may not have that module.
    from gcs.store import WriteBatch
    from gcs.store.redis.store import RedisStore
    from gcs.testing.redis_server import redis_server

    def batch(seq: int) -> WriteBatch:
        out = WriteBatch()
        for j in range(10):
            out.put("NODE", f"{seq}-{j}".encode(), VALUE)
        return out

    with redis_server(appendfsync=appendfsync) as server:
        store = RedisStore(server.url, namespace="bench")
        await store.open()
        try:
            cpu_started = time.process_time()
            latencies: list[float] = []
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                await store.write(batch(len(latencies)))
                latencies.append(time.perf_counter() - started)
            done = 0
            deadline = time.perf_counter() + seconds

            async def writer(worker: int) -> None:
                nonlocal done
                i = 0
                while time.perf_counter() < deadline:
                    await store.write(batch(1_000_000 * (worker + 1) + i))
                    i += 1
                    done += 1

            started = time.perf_counter()
            await asyncio.gather(*(writer(w) for w in range(8)))
            rate = done / (time.perf_counter() - started)
            cpu = (time.process_time() - cpu_started) / (len(latencies) + done)
            reads: list[float] = []
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                await store.get("NODE", b"1-1")
                reads.append(time.perf_counter() - started)
        finally:
            await store.close()
    cuts = statistics.quantiles(latencies, n=100)
    return {
        "write_p50_ms": cuts[49] * 1e3,
        "write_p99_ms": cuts[98] * 1e3,
        "x8_batches_per_s": rate,
        "cpu_per_write_us": cpu * 1e6,
        "get_p50_ms": statistics.median(reads) * 1e3,
    }


def _run(tree: str, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, _TREE_ENV: tree, "PYTHONPATH": tree}
    command = [sys.executable, __file__, "--measure", "--seconds", str(args.seconds)]
    out = subprocess.run(
        [*command, "--appendfsync", args.appendfsync],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(args: argparse.Namespace) -> None:
    trees = {"base": os.path.abspath(args.base), "this": HERE}
    figures: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    for round_ in range(args.rounds):
        order = ["base", "this"] if round_ % 2 == 0 else ["this", "base"]
        for name in order:
            figures[name].append(_run(trees[name], args))
            f = figures[name][-1]
            print(
                f"round {round_} {name:4s} write p50 {f['write_p50_ms']:6.3f} ms p99 "
                f"{f['write_p99_ms']:6.3f} ms | x8 {f['x8_batches_per_s']:6.0f}/s | CPU/write "
                f"{f['cpu_per_write_us']:5.0f} us | get p50 {f['get_p50_ms']:6.3f} ms",
                flush=True,
            )
    print(f"medians over {args.rounds} rounds (this/base):")
    for key in figures["base"][0]:
        base = statistics.median(f[key] for f in figures["base"])
        this = statistics.median(f[key] for f in figures["this"])
        print(f"  {key:18s} base {base:9.3f}  this {this:9.3f}  x{this / base:.2f}")
    print("load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the other checkout (its protos built)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--appendfsync", choices=["always", "no"], default="always")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.measure:
        sys.path.insert(0, os.environ.get(_TREE_ENV, HERE))
        print(json.dumps(asyncio.run(_measure(parsed.seconds, parsed.appendfsync))))
    elif not parsed.base:
        parser.error("--base is required")
    else:
        main(parsed)
