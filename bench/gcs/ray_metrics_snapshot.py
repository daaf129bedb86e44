"""Event-loop time of one export to Ray's metrics agent (``gcs.server.ray_metrics``).

Every ``metrics_report_interval_ms`` (10 s) the GCS reads its managers into Ray's metric
families and encodes the change as one OTLP request, on the event loop.  This measures
that, for N actors (50 classes, a tenth dead) and N/10 placement groups, against the
scan our own ``/metrics`` scrape already makes per actor (``count_by_state``), in the same
process; and the first version's per-actor labels as the 'before' figure.

    python -m bench.gcs.ray_metrics_snapshot [--actors 100000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from gcs.proto import gcs_pb2
from gcs.server.ray_metrics import (
    DeltaEncoder,
    Family,
    actor_families,
    placement_group_families,
)

A = gcs_pb2.ActorTableData
PG = gcs_pb2.PlacementGroupTableData


def per_actor_labels(actors: list[gcs_pb2.ActorTableData]) -> dict[tuple, float]:
    """The first version: a sorted label tuple built per actor (kept as the 'before')."""
    out: dict[tuple, float] = {}
    for actor in actors:
        key = tuple(
            sorted(
                {
                    "State": A.ActorState.Name(actor.state),
                    "Name": actor.class_name,
                    "Source": "gcs",
                }.items()
            )
        )
        out[key] = out.get(key, 0.0) + 1
    return out


def count_by_state(actors: list[gcs_pb2.ActorTableData]) -> dict[str, int]:
    """What ``ActorManager.count_by_state`` does for our own scrape (the baseline)."""
    counts = dict.fromkeys(A.ActorState.keys(), 0)
    for actor in actors:
        counts[A.ActorState.Name(actor.state)] += 1
    return counts


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n = args.actors
    actors = [
        A(state=A.DEAD if i % 10 == 0 else A.ALIVE, class_name=f"Class{i % 50}") for i in range(n)
    ]
    groups = [
        PG(placement_group_id=i.to_bytes(18, "big"), state=PG.CREATED) for i in range(n // 10)
    ]
    encoder = DeltaEncoder({"Component": "gcs_server", "NodeAddress": "10.0.0.1"})

    def export() -> None:
        families: list[Family] = [*actor_families(actors), *placement_group_families(groups)]
        request, sent = encoder.request(families, 1)
        request.SerializeToString()
        encoder.commit(sent)

    baseline = best_ms(lambda: count_by_state(actors), args.repeats)
    before = best_ms(lambda: per_actor_labels(actors), args.repeats)
    after = best_ms(export, args.repeats)
    print(f"{n:,} actors, {len(groups):,} placement groups, best of {args.repeats}:")
    print(f"  our /metrics actor scan (baseline)      {baseline:7.1f} ms  1.00x")
    print(f"  before: labels built per actor          {before:7.1f} ms  {before / baseline:.2f}x")
    print(f"  export: families + OTLP request, encoded {after:7.1f} ms  {after / baseline:.2f}x")


if __name__ == "__main__":
    main()
