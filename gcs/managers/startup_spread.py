"""When to first contact each raylet known from the store after a restart (pure policy).

50,000 raylets contacted at once cost the GCS gigabytes and every file descriptor it has;
contacts are spread over ``nodes / rate`` seconds instead, at a steady rate.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator


def spread_window_s(nodes: int, contacts_per_s: int) -> float:
    return nodes / contacts_per_s if contacts_per_s > 0 else 0.0


def spread(
    node_ids: Iterable[bytes], start_s: float, window_s: float, rng: random.Random
) -> dict[bytes, float]:
    """Times in ``[start_s, start_s + window_s)``, one per node, evenly spaced with jitter,
    in time order.

    The order is shuffled and each node gets a random point in its own slot, so contacts
    start at a steady rate without a burst at either end (stratified jitter).
    """
    ids = list(node_ids)
    rng.shuffle(ids)
    if not ids or window_s <= 0:
        return dict.fromkeys(ids, start_s)
    slot = window_s / len(ids)
    return {node_id: start_s + (i + rng.random()) * slot for i, node_id in enumerate(ids)}


def spread_lazily(
    node_ids: list[bytes], window_s: float, rng: random.Random
) -> Iterator[tuple[bytes, float]]:
    """As :func:`spread` (from 0), in time order, each drawn as it is consumed: the shuffle
    (one Fisher-Yates step per node) is paid over the window, not before the GCS serves.
    Shuffles ``node_ids`` in place."""
    count = len(node_ids)
    slot = window_s / count if count and window_s > 0 else 0.0
    for i in range(count):
        j = rng.randrange(i, count)
        node_ids[i], node_ids[j] = node_ids[j], node_ids[i]
        yield node_ids[i], (i + rng.random()) * slot if slot else 0.0
