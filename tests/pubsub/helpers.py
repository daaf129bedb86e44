"""Builders shared by the pubsub tests."""

from __future__ import annotations

import asyncio
from typing import Any

from gcs.base.changes import Changes
from gcs.base.clock import FakeClock
from gcs.managers.pubsub import Publisher, PublisherConfig
from gcs.proto import gcs_pb2

PID = b"P" * 28
OTHER_PID = b"Q" * 28


def node(name: str) -> gcs_pb2.GcsNodeInfo:
    return gcs_pb2.GcsNodeInfo(node_id=name.encode().ljust(28, b"\0"), node_name=name)


def sub_id(n: int) -> bytes:
    return n.to_bytes(28, "big")


def control_plane(clock: FakeClock | None = None, **overrides: object) -> Publisher:
    import dataclasses

    cfg = dataclasses.replace(PublisherConfig.control_plane(), **overrides)  # type: ignore[arg-type]
    return Publisher(cfg, clock or FakeClock(), publisher_id=PID)


def observability(clock: FakeClock | None = None, **overrides: object) -> Publisher:
    import dataclasses

    cfg = dataclasses.replace(PublisherConfig.observability(), **overrides)  # type: ignore[arg-type]
    return Publisher(cfg, clock or FakeClock(), publisher_id=PID)


def watch_polls(pub: Publisher) -> Changes:
    """Notified whenever the publisher takes a poll (acks are applied by polls) and when a
    poll it returned ends (answered, or cancelled by the client going away): tests wait for
    ``pub.held_poll_count()`` or ``pub.queued(...)`` on this, not on time."""
    polled = Changes()
    poll = pub.poll

    def poll_and_tell(*args: Any) -> asyncio.Future[Any]:
        try:
            future = poll(*args)
        finally:
            polled.notify()
        future.add_done_callback(lambda _: polled.notify())
        return future

    pub.poll = poll_and_tell  # type: ignore[method-assign]
    return polled
