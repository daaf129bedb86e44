"""Ray's ``testing_asio_delay_us``: chosen GCS handlers wait before they run.

Ray's own tests use it to make the GCS answer late, e.g.
``RAY_testing_asio_delay_us="ActorInfoGcsService.grpc_server.ListNamedActors=3000000:3000000"``
holds every ``ListNamedActors`` for 3 s, so a driver's 1 s ``gcs_server_request_timeout_seconds``
passes and ``ray.util.list_named_actors()`` raises ``GetTimeoutError``.

The value (from ``--config_list`` or ``RAY_testing_asio_delay_us``) is a comma-separated list of
``NAME=MIN_US:MAX_US``.  Each call waits ``MIN_US`` when the two are equal, else a uniformly
drawn whole number of microseconds in ``[MIN_US, MAX_US)`` (Ray's draw).  ``NAME`` is
``<Service>.grpc_server.<Method>`` (the service's short name, as Ray names its handlers) or
``*`` for every handler without an entry of its own.  Ray's other names (``...grpc_client...``,
timers) belong to the processes that make those calls and match nothing here.  A malformed
entry stops the GCS at start with the entry named (Ray's GCS aborts on it too).

Only the unary handlers wait (every GCS method but the pubsub long polls and the syncer
stream); a call's deadline runs while it waits, as in Ray.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger("gcs.rpc")

WILDCARD = "*"
_SYNTAX = "expected NAME=MIN_US:MAX_US"

Pause = Callable[[], Awaitable[None]]


class DelaySpecError(ValueError):
    """The ``testing_asio_delay_us`` value is malformed; the message names the entry."""


def handler_name(service: str, method: str) -> str:
    """Ray's name for a GCS handler: ``ActorInfoGcsService.grpc_server.ListNamedActors``."""
    return f"{service}.grpc_server.{method}"


@dataclass(frozen=True, slots=True)
class HandlerDelays:
    """The parsed value: per handler name, and for the rest (``*``), a range in µs."""

    by_name: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    others: tuple[int, int] = (0, 0)

    @classmethod
    def parse(cls, text: str) -> HandlerDelays:
        by_name: dict[str, tuple[int, int]] = {}
        others = (0, 0)
        if not text:
            return cls()
        for entry in text.split(","):
            parts = entry.split("=")
            if len(parts) != 2:
                raise DelaySpecError(f"{entry!r}: {_SYNTAX}")
            name, bounds = parts
            ends = bounds.split(":")
            if len(ends) != 2:
                raise DelaySpecError(f"{entry!r}: {_SYNTAX}")
            try:
                low, high = (int(end.strip()) for end in ends)
            except ValueError:
                raise DelaySpecError(f"{entry!r}: {_SYNTAX} (whole microseconds)") from None
            if low > high:
                raise DelaySpecError(f"{entry!r}: {low} is bigger than {high}")
            if name == WILDCARD:
                others = (low, high)
            else:
                by_name[name] = (low, high)
        return cls(by_name, others)

    def range_us(self, service: str, method: str) -> tuple[int, int]:
        return self.by_name.get(handler_name(service, method), self.others)

    def pause_for(
        self,
        service: str,
        method: str,
        sleep: Callable[[float], Awaitable[None]],
        rng: random.Random,
    ) -> Pause | None:
        """What a handler of ``service.method`` awaits before it runs; None when it never
        waits (the handler then pays nothing)."""
        low, high = self.range_us(service, method)
        if high <= 0:
            return None
        name = handler_name(service, method)

        async def pause() -> None:
            delay_us = low if low == high else rng.randrange(low, high)
            if delay_us > 0:
                await sleep(delay_us / 1e6)

        log.warning("rpc.testing_delay", handler=name, min_us=low, max_us=high)
        return pause
