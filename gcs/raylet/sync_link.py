"""The raylet half of Ray's syncer (``ray.rpc.syncer.RaySyncer/StartSync``), as a 2.60 raylet
speaks it, so that fleets of agents load a GCS (ours or Ray's ``gcs_server``) like real raylets.

What a 2.60 raylet does (``node_manager.cc``, ``local_resource_manager.cc``, ``ray_syncer.cc``):

* one bidi stream to the GCS, metadata ``node_id`` = its hex id;
* RESOURCE_VIEW: its local resource manager bumps a version on every resource or idle/busy
  state change; the syncer looks every ``raylet_report_resources_period_milliseconds``
  (100 ms) and sends the view (available, total, object_pulls_queued, idle_duration_ms at
  creation, is_draining, deadline, node_activity) only when the version moved — right after
  connecting, then **only on change** (an idle node sends nothing);
* COMMANDS (``should_global_gc``) only on demand, when plasma is under pressure: never for a
  synthetic raylet (it has no object store), so the agent registers the type and sends none;
* it reads every other node's views the GCS relays to it (its cluster view).

Here a change is announced by the servicer (:meth:`SyncerLink.changed`); the writer sends at
most one view per period (changes in between coalesce, as Ray's 100 ms pull does), and only
when the view differs from the last one sent.  A broken stream is reopened after a capped
back-off and the current view is sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import structlog

from gcs.base.changes import Changes
from gcs.base.clock import Clock, SystemClock
from gcs.proto import ray_syncer_pb2

log = structlog.get_logger("gcs.raylet.sync_link")

START_SYNC_PATH = "/ray.rpc.syncer.RaySyncer/StartSync"
REPORT_PERIOD_S = 0.1
"""Ray's ``raylet_report_resources_period_milliseconds`` (100)."""

ViewSource = Callable[[], ray_syncer_pb2.ResourceViewSyncMessage]


@dataclass(slots=True)
class LinkStats:
    connects: int = 0
    sent: int = 0
    """RESOURCE_VIEW messages sent."""
    received: int = 0
    """Messages (other nodes' views) received from the GCS."""
    frames_received: int = 0


def view_fingerprint(view: ray_syncer_pb2.ResourceViewSyncMessage) -> bytes:
    """What makes a view "changed": everything but the idle duration (which grows with time
    without a version bump in Ray, only idle <-> busy counts)."""
    copy = ray_syncer_pb2.ResourceViewSyncMessage()
    copy.CopyFrom(view)
    copy.idle_duration_ms = 1 if view.idle_duration_ms > 0 else 0
    return copy.SerializeToString(deterministic=True)


class SyncerLink:
    """One raylet's syncer stream.  ``run()`` until cancelled; ``changed()`` from the
    servicer whenever resources or idle/draining state may have moved."""

    def __init__(
        self,
        node_id: bytes,
        channel: grpc.aio.Channel,
        view: ViewSource,
        *,
        metadata: tuple[tuple[str, str], ...] = (),
        period_s: float = REPORT_PERIOD_S,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 5.0,
        clock: Clock | None = None,
        on_ended: Callable[[grpc.StatusCode], None] | None = None,
    ) -> None:
        """``clock``: the report period and the reconnect back-off run on it.  ``on_ended``:
        told the status code each time the stream ends with one (the agent checks at once
        whether the GCS is gone)."""
        self.node_id = node_id
        self._on_ended = on_ended
        self._clock = clock or SystemClock()
        self._channel = channel
        self._view = view
        self._metadata = (("node_id", node_id.hex()), *metadata)
        self._period_s = period_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self.version = 0
        self._versioned: bytes | None = None
        """Fingerprint of the view ``version`` stands for (a change bumps the version)."""
        self._sent_fingerprint: bytes | None = None
        self._dirty = asyncio.Event()
        self.connected = asyncio.Event()
        self.views: dict[bytes, int] = {}
        """Other nodes' newest RESOURCE_VIEW version, as relayed by the GCS."""
        self.stats = LinkStats()
        self.changes = Changes()
        """Notified on every (re)connect, view sent and batch of views received."""

    def changed(self) -> None:
        self._dirty.set()

    async def run(self) -> None:
        backoff_s = self._backoff_initial_s
        clock = self._clock
        while True:
            started = clock.monotonic_s()
            try:
                await self._stream()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as err:
                log.debug("raylet.syncer_ended", node_id=self.node_id.hex(), code=err.code())
                if self._on_ended is not None:
                    self._on_ended(err.code())
            except Exception:  # a bug of ours: reconnect rather than lose the link, say why
                log.exception("raylet.syncer_failed", node_id=self.node_id.hex())
            self.connected.clear()
            if clock.monotonic_s() - started > self._backoff_max_s:
                backoff_s = self._backoff_initial_s  # it had been up: start over
            await clock.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, self._backoff_max_s)

    async def _stream(self) -> None:
        method = self._channel.stream_stream(
            START_SYNC_PATH, request_serializer=None, response_deserializer=None
        )
        call = method(metadata=self._metadata)
        self.stats.connects += 1
        self.changes.notify()
        self._sent_fingerprint = None  # a new stream (maybe a new GCS): send the view again
        reader = asyncio.get_running_loop().create_task(self._read(call))
        try:
            await self._send_view(call)
            self.connected.set()
            while not reader.done():
                dirty = asyncio.ensure_future(self._dirty.wait())
                done, _ = await asyncio.wait({dirty, reader}, return_when=asyncio.FIRST_COMPLETED)
                if reader in done:
                    dirty.cancel()
                    break
                await self._clock.sleep(self._period_s)  # coalesce, as Ray's 100 ms pull does
                await self._send_view(call)
            await reader  # raises the stream's error, if any
        finally:
            reader.cancel()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader

    async def _send_view(self, call: grpc.aio.StreamStreamCall) -> None:
        self._dirty.clear()
        view = self._view()
        fingerprint = view_fingerprint(view)
        if fingerprint == self._sent_fingerprint:
            return
        if fingerprint != self._versioned:
            self.version += 1
            self._versioned = fingerprint
        message = ray_syncer_pb2.RaySyncMessage(
            version=self.version,
            message_type=ray_syncer_pb2.RESOURCE_VIEW,
            sync_message=view.SerializeToString(),
            node_id=self.node_id,
        )
        await call.write(ray_syncer_pb2.RaySyncMessageBatch(messages=[message]).SerializeToString())
        self._sent_fingerprint = fingerprint
        self.stats.sent += 1
        self.changes.notify()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        views, stats = self.views, self.stats
        while True:
            raw = await call.read()
            if raw is grpc.aio.EOF:
                return
            batch = ray_syncer_pb2.RaySyncMessageBatch.FromString(raw)
            stats.frames_received += 1
            stats.received += len(batch.messages)
            for message in batch.messages:
                if message.message_type == ray_syncer_pb2.RESOURCE_VIEW and (
                    message.version > views.get(message.node_id, -1)
                ):
                    views[message.node_id] = message.version
            self.changes.notify()
