"""Ray's "Event stats" report: what the GCS's handlers did, logged periodically.

Ray's GCS logs, every ``event_stats_print_interval_ms`` (60,000 by default; a period of 0
or less, or ``event_stats`` off, turns it off), one block per event loop that operators grep
``gcs_server.out`` for and Ray's own tests look for (``test_logging.py::
test_periodic_event_stats``)::

    Main service Event stats:


    Global stats: 17 total
    Execution time:  mean = 4.14ms, total = 70.40ms
    Event stats:
        NodeInfoGcsService.grpc_server.GetAllNodeInfo - 6 total, Execution time: mean = ...

Ours counts what the RPC layer sees (every call of every handler and how long it ran: the
``on_call`` hook, beside the Prometheus one) and prints Ray's layout, handlers named as Ray
names them (``<Service>.grpc_server.<Method>``), the busiest first.  Ray's "active" and
"Queueing time" figures are left out rather than made up: an asyncio server does not see a
request before its handler starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gcs.base.clock import Clock
from gcs.base.handler_delays import handler_name

__all__ = ["HandlerStats", "print_periodically", "ray_event_name"]


def ray_event_name(path: str) -> str:
    """``/ray.rpc.NodeInfoGcsService/GetAllNodeInfo`` -> Ray's
    ``NodeInfoGcsService.grpc_server.GetAllNodeInfo`` (other names are kept)."""
    service, _, method = path.lstrip("/").partition("/")
    if not method:
        return path
    return handler_name(service.rsplit(".", 1)[-1], method)


@dataclass
class _Counts:
    total: int = 0
    seconds: float = 0.0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}ms"


class HandlerStats:
    """Calls and execution time per handler since start; ``on_call`` is an RPC call hook."""

    def __init__(self) -> None:
        self._by_path: dict[str, _Counts] = {}

    def on_call(self, path: str, code: str, seconds: float) -> None:
        counts = self._by_path.get(path)
        if counts is None:
            counts = self._by_path[path] = _Counts()
        counts.total += 1
        counts.seconds += seconds

    def report(self, loop_name: str = "Main service") -> str:
        """Ray's block for one event loop (see the module docstring)."""
        total = sum(c.total for c in self._by_path.values())
        seconds = sum(c.seconds for c in self._by_path.values())
        lines = [
            f"{loop_name} Event stats:",
            "",
            "",
            f"Global stats: {total} total",
            f"Execution time:  mean = {_ms(seconds / total if total else 0.0)}, "
            f"total = {_ms(seconds)}",
            "Event stats:",
        ]
        busiest = sorted(self._by_path.items(), key=lambda item: (-item[1].total, item[0]))
        for path, counts in busiest:
            lines.append(
                f"\t{ray_event_name(path)} - {counts.total} total, Execution time: "
                f"mean = {_ms(counts.seconds / counts.total)}, total = {_ms(counts.seconds)}"
            )
        return "\n".join(lines) + "\n\n"


async def print_periodically(
    stats: HandlerStats, clock: Clock, interval_ms: int, emit: Callable[[str], object]
) -> None:
    """``emit(stats.report())`` every ``interval_ms`` of ``clock`` (returns at once when the
    period is 0 or less: off, as Ray's periodic runner skips such a period)."""
    if interval_ms <= 0:
        return
    while True:
        await clock.sleep(interval_ms / 1000)
        emit(stats.report())
