"""How many raylet clients and calls the GCS can afford, from config and RLIMIT_NOFILE."""

from __future__ import annotations

import resource
from dataclasses import dataclass

from gcs.config import RayletIoConfig

FDS_PER_CLIENT = 2
"""A raylet client holds at most an HTTP/2 connection and a gRPC channel's socket."""
MAX_IN_FLIGHT_DEFAULT = 1024


@dataclass(frozen=True, slots=True)
class RayletIoBudget:
    max_open_clients: int
    max_in_flight: int
    max_calls_per_s: int
    """0 = unlimited."""


def nofile_soft_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def budget_for(config: RayletIoConfig, nofile: int) -> RayletIoBudget:
    """Explicit settings win; otherwise raylets get 3/4 of ``nofile`` (>= 256 fds kept back)."""
    max_open = config.max_open_clients
    if max_open == 0:
        reserve = max(256, nofile // 4)
        max_open = max(16, (nofile - reserve) // FDS_PER_CLIENT)
    max_in_flight = config.max_in_flight
    if max_in_flight == 0:
        max_in_flight = min(MAX_IN_FLIGHT_DEFAULT, max(1, max_open * 3 // 4))
    # A leased client is never evicted: with fewer calls than clients, one is always idle.
    max_in_flight = min(max_in_flight, max_open)
    return RayletIoBudget(
        max_open_clients=max_open,
        max_in_flight=max_in_flight,
        max_calls_per_s=config.max_calls_per_s,
    )
