"""When to first contact each raylet known from the store after a restart (pure policy).

50,000 raylets contacted at once cost the GCS gigabytes and every file descriptor it has;
contacts are spread over ``nodes / rate`` seconds instead, at a steady rate.
"""

from __future__ import annotations

import random
from collections.abc import Iterable


def spread_window_s(nodes: int, contacts_per_s: int) -> float:
    return nodes / contacts_per_s if contacts_per_s > 0 else 0.0


def spread(
    node_ids: Iterable[bytes], start_s: float, window_s: float, rng: random.Random
) -> dict[bytes, float]:
    """Times in ``[start_s, start_s + window_s)``, one per node, evenly spaced with jitter,
    in time order (no caller sorts 10,000 of them).

    The order is shuffled and each node gets a random point in its own slot, so contacts
    start at a steady rate without a burst at either end (stratified jitter).
    """
    ids = list(node_ids)
    rng.shuffle(ids)
    if not ids or window_s <= 0:
        return dict.fromkeys(ids, start_s)
    slot = window_s / len(ids)
    return {node_id: start_s + (i + rng.random()) * slot for i, node_id in enumerate(ids)}
